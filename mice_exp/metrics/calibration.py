"""Calibration and discrimination scores of confidences p against correctness labels y.

relplot is imported where it is used: its package draws with matplotlib on import, which the
estimators (that score with these metrics) should not pay for.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from sklearn.metrics import roc_auc_score

from mice_exp.metrics.binning import equal_width_bins
from mice_exp.metrics.smooth_ece import exact_rows
from mice_exp.metrics.validation import check_labels, check_pair


def smece(p: ArrayLike, y: ArrayLike) -> float:
    """Smooth ECE (Błasiok & Nakkiran 2024) via relplot, the reference implementation MICE used."""
    import relplot

    p, y = check_pair(p, y)
    if exact_rows(p, y):  # relplot's own answer, without its slowest search (exact_rows)
        return 0.0
    return float(relplot.smECE(p, y.astype(float)))


def binned_ece(p: ArrayLike, y: ArrayLike, n_bins: int = 15) -> float:
    """Histogram ECE: bin-size-weighted |accuracy - mean confidence| over equal-width bins.

    Uses the same bins as the histogram estimator ([k/n, (k+1)/n), last bin closed).
    """
    p, y = check_pair(p, y)
    gap_sums = np.bincount(equal_width_bins(p, n_bins), weights=p - y, minlength=n_bins)
    return float(np.abs(gap_sums).sum() / p.size)


def brier(p: ArrayLike, y: ArrayLike) -> float:
    """Mean squared error of the confidences, rewarding calibration and sharpness together."""
    p, y = check_pair(p, y)
    return float(np.mean((p - y) ** 2))


def auroc(p: ArrayLike, y: ArrayLike) -> float:
    """Area under the ROC curve; NaN when y has a single class, where ranking is undefined."""
    p, y = check_pair(p, y)
    if np.unique(y).size < 2:
        return float("nan")
    return float(roc_auc_score(y, p))


def accuracy(y: ArrayLike) -> float:
    """Base rate of correct calls: what a constant confidence would have to predict."""
    return float(check_labels(y).mean())


def wilson_interval(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of an accuracy: unlike the normal approximation it stays inside [0, 1]
    and is not empty at 0 / n, which is what a 50-call probe of a category often measures."""
    if total <= 0:
        return float("nan"), float("nan")
    rate, spread = correct / total, z * z / total
    centre = (rate + spread / 2) / (1 + spread)
    half = z * np.sqrt(rate * (1 - rate) / total + spread / (4 * total)) / (1 + spread)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))
