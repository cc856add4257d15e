"""Regime diagnostics: where the field says over/underconfident, how bad calibration is there,
and whether other confidences (isotonic, temperature scaling, the local correction) fix it
(paper Fig. 4-6).

The confidences to score come in as predictions and figures are drawn by the caller, so the
regimes library depends on metrics alone, not on the estimators or the report built on top of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from mice_exp.metrics.calibration import brier, smece

#: Signed regions of the field; "good" is the near-calibrated rest, |delta_hat| <= eps.
REGIONS = ("all", "over", "under", "good")


def regions(delta: np.ndarray, eps: float = 0.05) -> dict[str, np.ndarray]:
    """Boolean masks: overconfident {delta < -eps}, underconfident {delta > eps}, and the rest."""
    return {
        "all": np.ones(len(delta), dtype=bool),
        "over": delta < -eps,
        "under": delta > eps,
        "good": np.abs(delta) <= eps,
    }


def regime_metrics(
    delta: np.ndarray,
    y: np.ndarray,
    predictions: Mapping[str, np.ndarray],
    eps: float = 0.05,
    min_region: int = 30,
) -> dict[str, float]:
    """Flat, MLflow-loggable floats for one held-out split.

    ``predictions`` maps a method name to confidences on the same points and must contain
    "base" (the raw f); the regions come from ``delta``. Keys: ``field_mean``, ``field_std``,
    ``frac_<region>``, ``smece_<region>_<method>``, ``brier_<region>_<method>`` (NaN for a region
    with fewer than ``min_region`` points, where smECE is mostly noise), ``worst_slice_gap`` (the
    larger base smECE of the over/under regions minus the global one; 0 when neither region is
    populated, i.e. nothing hidden was found) and ``worst_slice_frac``.
    """
    metrics = {"field_mean": float(np.mean(delta)), "field_std": float(np.std(delta))}
    for region, mask in regions(delta, eps).items():
        metrics[f"frac_{region}"] = float(mask.mean())
        populated = mask.sum() >= min_region
        for method, p in predictions.items():
            metrics[f"smece_{region}_{method}"] = smece(p[mask], y[mask]) if populated else float("nan")
            metrics[f"brier_{region}_{method}"] = brier(p[mask], y[mask]) if populated else float("nan")
    slices = [r for r in ("over", "under") if not np.isnan(metrics[f"smece_{r}_base"])]
    worst = max(slices, key=lambda r: metrics[f"smece_{r}_base"], default=None)
    metrics["worst_slice_gap"] = metrics[f"smece_{worst}_base"] - metrics["smece_all_base"] if worst else 0.0
    metrics["worst_slice_frac"] = metrics[f"frac_{worst}"] if worst else 0.0
    return metrics


@dataclass(frozen=True)
class Diagnosis:
    """Regime metrics of one held-out split and the masks of its populated regions (to draw them)."""

    metrics: dict[str, float]
    regions: dict[str, np.ndarray]


def diagnose(
    delta: np.ndarray,
    y: np.ndarray,
    predictions: Mapping[str, np.ndarray],
    eps: float = 0.05,
    min_region: int = 30,
) -> Diagnosis:
    """:func:`regime_metrics` plus the regions with at least ``min_region`` points: the ones worth a
    reliability diagram of the raw f."""
    masks = {region: mask for region, mask in regions(delta, eps).items() if mask.sum() >= min_region}
    return Diagnosis(regime_metrics(delta, y, predictions, eps, min_region), masks)
