"""Every score of one estimator on one split, as a flat dict ready for MLflow's log_metrics."""

from __future__ import annotations

import re

from numpy.typing import ArrayLike

from mice_exp.metrics.calibration import accuracy, auroc, binned_ece, brier
from mice_exp.metrics.euro import auc_euro, euro
from mice_exp.metrics.registry import METRICS
from mice_exp.metrics.utility import PAPER_RISKS, Risk, etcu
from mice_exp.metrics.validation import check_pair

# A subset of what MLflow accepts in metric keys, so names also stay valid file and column names.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def evaluate(p: ArrayLike, y: ArrayLike, risks: dict[str, Risk]) -> dict[str, float]:
    """The tables' metrics (:data:`~mice_exp.metrics.registry.METRICS`: smece, etcu_<paper risk>..., auc_etcu,
    prr, aurc), then ece, brier, auroc, accuracy, etcu at any other risk, euro_<risk>..., auc_euro.

    ``risks`` add to (or replace, by name) the paper's three; euro at a risk uses u_ca = risk.tau, the
    threshold that risk sets for the MBR policy.
    """
    for name in risks:
        if not _SAFE_NAME.fullmatch(name):
            raise ValueError(f"risk name {name!r} must use only letters, digits, '_', '-' and '.'")
    p, y = check_pair(p, y)
    risks = {**PAPER_RISKS, **risks}
    scores = {name: metric.score(p, y, risks) for name, metric in METRICS.items()}
    scores |= {"ece": binned_ece(p, y), "brier": brier(p, y), "auroc": auroc(p, y), "accuracy": accuracy(y)}
    scores |= {f"etcu_{name}": etcu(p, y, risk) for name, risk in risks.items() if f"etcu_{name}" not in scores}
    scores |= {f"euro_{name}": euro(p, y, risk.tau) for name, risk in risks.items()}
    scores["auc_euro"] = auc_euro(p, y)
    return scores
