"""Metrics for confidence estimators: calibration, tool-calling utility (MICE) and euro (ACUTE).

Depends on nothing else in mice_exp, so estimators and reports can both build on it.
"""

from mice_exp.metrics.calibration import accuracy, auroc, binned_ece, brier, smece
from mice_exp.metrics.euro import auc_euro, euro, euro_curve
from mice_exp.metrics.evaluate import evaluate
from mice_exp.metrics.permutation import ALPHA, MAX_PERMUTATIONS, PermutationResult, permutation_test
from mice_exp.metrics.policies import (
    TRIVIAL_POLICIES,
    always_abstain,
    always_execute,
    base_rate,
    oracle,
)
from mice_exp.metrics.selective import aurc, prr, risk_coverage_curve
from mice_exp.metrics.smooth_ece import smece_rows
from mice_exp.metrics.utility import (
    HIGH,
    LOW,
    MEDIUM,
    PAPER_RISKS,
    TAU_GRID,
    Risk,
    auc_etcu,
    auc_etcu_rows,
    etcu,
    etcu_curve,
    etcu_rows,
    mbr_threshold,
)

__all__ = [
    "ALPHA",
    "HIGH",
    "LOW",
    "MAX_PERMUTATIONS",
    "MEDIUM",
    "PAPER_RISKS",
    "TAU_GRID",
    "TRIVIAL_POLICIES",
    "PermutationResult",
    "Risk",
    "accuracy",
    "always_abstain",
    "always_execute",
    "aurc",
    "auc_etcu",
    "auc_etcu_rows",
    "auc_euro",
    "auroc",
    "base_rate",
    "binned_ece",
    "brier",
    "etcu",
    "etcu_curve",
    "etcu_rows",
    "euro",
    "euro_curve",
    "evaluate",
    "mbr_threshold",
    "oracle",
    "permutation_test",
    "prr",
    "risk_coverage_curve",
    "smece",
    "smece_rows",
]
