"""Paired permutation test between two confidence estimators scored on the same examples (MICE §5)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from mice_exp.metrics.validation import check_pair

Metric = Callable[[np.ndarray, np.ndarray], float]


@dataclass(frozen=True)
class PermutationResult:
    """Observed metric(a) - metric(b) and its two-sided p-value."""

    difference: float
    p_value: float


def permutation_test(
    metric: Metric,
    p_a: ArrayLike,
    p_b: ArrayLike,
    y: ArrayLike,
    n_permutations: int = 1000,
    seed: int = 0,
) -> PermutationResult:
    """Test whether metric(p_a) and metric(p_b) differ by swapping the two predictions per example.

    Under the null the two estimators are exchangeable on every example, so each random swap set
    draws from the null distribution of the difference. p = (count + 1) / (n_permutations + 1),
    count being the permuted |differences| at least as large as the observed one; a small relative
    tolerance keeps float noise from splitting ties. A NaN metric (e.g. AUROC on one class) gives NaN.
    """
    p_a, y = check_pair(p_a, y)
    p_b, _ = check_pair(p_b, y)
    observed = metric(p_a, y) - metric(p_b, y)
    if np.isnan(observed):
        return PermutationResult(float("nan"), float("nan"))
    swaps = np.random.default_rng(seed).random((n_permutations, y.size)) < 0.5
    null = np.array(
        [metric(np.where(swap, p_b, p_a), y) - metric(np.where(swap, p_a, p_b), y) for swap in swaps]
    )
    tolerance = 1e-12 * max(1.0, abs(observed))
    count = np.count_nonzero(np.abs(null) >= abs(observed) - tolerance)
    return PermutationResult(float(observed), (count + 1) / (n_permutations + 1))
