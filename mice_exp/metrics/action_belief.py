"""Action-belief consistency (Pal et al., 2026, appendix F): does the agent act on its confidence?"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import spearmanr

from mice_exp.metrics.utility import Risk


def action_belief_consistency(confidence: ArrayLike, acted: ArrayLike, n_bins: int = 10) -> float:
    """Spearman correlation of the non-abstention rate against confidence over equal-percentile bins.

    Bins are [b_k, b_k+1) between the 0th, 10th, ..., 100th percentiles (the last closed); each
    bin's rate is paired with its midpoint (b_k + b_k+1) / 2. +1: the agent acts more the more
    confident it is; -1: maximally inconsistent. NaN when fewer than two bins are occupied or a
    side is constant. Missing confidences (NaN) are left out.
    """
    c, a = np.asarray(confidence, dtype=float), np.asarray(acted, dtype=float)
    keep = ~np.isnan(c)
    c, a = c[keep], a[keep]
    if len(c) == 0:
        return float("nan")
    edges = np.percentile(c, np.linspace(0, 100, n_bins + 1))
    index = np.clip(np.searchsorted(edges, c, side="right") - 1, 0, n_bins - 1)
    occupied = np.unique(index)
    rates = [a[index == k].mean() for k in occupied]
    mids = [(edges[k] + edges[k + 1]) / 2 for k in occupied]
    if len(occupied) < 2 or np.ptp(rates) == 0 or np.ptp(mids) == 0:
        return float("nan")
    return float(spearmanr(mids, rates).statistic)


def decision_agreement(p: ArrayLike, acted: ArrayLike, risk: Risk) -> float:
    """How often the agent's own choice equals the minimum-Bayes-risk decision (p > tau)."""
    return float(np.mean((np.asarray(p) > risk.tau) == np.asarray(acted, dtype=bool)))
