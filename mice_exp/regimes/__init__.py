"""Hidden miscalibration regimes (Kobalczyk & van der Schaar, 2026).

Estimate the input-dependent miscalibration field delta(x) = E[y - f | x] by kernel-smoothing
residuals in a learned representation, then read off over/underconfident regions, correct
confidences locally and audit the result. See README.md in this folder for a walk-through.
"""

from mice_exp.regimes.audits import Audit, permutation_null, seed_stability
from mice_exp.regimes.config import FieldConfig, preset_config
from mice_exp.regimes.correction import range_aware_correction, select_alpha
from mice_exp.regimes.data import Triples
from mice_exp.regimes.diagnostics import REGIONS, Diagnosis, diagnose, regime_metrics, regions
from mice_exp.regimes.field import MiscalibrationField, preset
from mice_exp.regimes.synthetic import SyntheticData, sinusoidal, three_clusters

__all__ = [
    "REGIONS",
    "Audit",
    "Diagnosis",
    "FieldConfig",
    "MiscalibrationField",
    "SyntheticData",
    "Triples",
    "diagnose",
    "permutation_null",
    "preset",
    "preset_config",
    "range_aware_correction",
    "regime_metrics",
    "regions",
    "seed_stability",
    "select_alpha",
    "sinusoidal",
    "three_clusters",
]
