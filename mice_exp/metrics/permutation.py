"""Paired permutation test between two confidence estimators scored on the same examples (MICE §5)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from mice_exp.metrics.validation import check_pair

Metric = Callable[[np.ndarray, np.ndarray], float]
#: The same metric over the rows of (draws x examples) matrices of confidences (and labels), one value per row.
RowsMetric = Callable[[np.ndarray, np.ndarray], np.ndarray]
ALPHA = 0.05  # the level of every significance mark, in runs and in reports
#: The Clopper-Pearson interval of the Monte-Carlo p that decides a mark: drawing goes on until it lies on one side
#: of alpha. Each look may err with probability 0.1%; the ~14 looks up to the cap err at most 1.4% of the time.
CONFIDENCE = 0.999
#: The most swap patterns a test scores (2^20); a test that has not decided by then is not significant.
MAX_PERMUTATIONS = 2**20
#: Draws scored before the first look; each later look adds twice as many as the one before, so a p far from
#: alpha is decided in the first block or two and one near it in a few looks.
FIRST_BLOCK = 100
#: Swap patterns scored in one call of a RowsMetric (2 x CHUNK x examples floats: ~13 MB for 200 examples).
CHUNK = 4096


@dataclass(frozen=True)
class PermutationResult:
    """Observed metric(a) - metric(b), its two-sided p-value and how the mark p < alpha was reached.

    ``draws``: swap patterns scored (every one, 2^m, when ``exact``); ``decided``: the p lies on one side of
    alpha for sure (``exact``) or with :data:`CONFIDENCE`; an undecided test's p is its interval's upper end."""

    difference: float
    p_value: float
    draws: int = 0
    exact: bool = False
    decided: bool = False


def permutation_test(
    metric: Metric,
    p_a: ArrayLike,
    p_b: ArrayLike,
    y: ArrayLike,
    seed: int = 0,
    alpha: float = ALPHA,
    max_permutations: int = MAX_PERMUTATIONS,
    rows_metric: RowsMetric | None = None,
) -> PermutationResult:
    """Test whether metric(p_a) and metric(p_b) differ by swapping the two predictions per example.

    Under the null the two estimators are exchangeable on every example, so each of the 2^m swap patterns of the
    m examples where they differ is as likely as the observed one; the exact p is the share of patterns whose
    |difference| is at least the observed one (a small relative tolerance keeps float noise from splitting ties).
    A NaN metric (e.g. AUROC on one class) gives NaN.

    The mark p < ``alpha`` must not depend on the draw. Patterns are drawn from the stream of ``seed`` in blocks
    (:data:`FIRST_BLOCK`, then doubling); after each block, with h of L draws at least as large, the test stops
    once the Clopper-Pearson :data:`CONFIDENCE` interval of h / L lies on one side of ``alpha`` and reports
    (h + 1) / (L + 1). A p far from alpha thus costs a block or two, one near it as many draws as it takes
    (12,700-51,100 for p ~ 0.046 or 0.055 in ``tests/test_metrics.py``). Where the next block would bring the
    draws to 2^m or more (m <= 20 under the default cap), every pattern is scored instead: the exact p. A test
    still undecided after ``max_permutations`` draws reports its interval's upper end (at least alpha: not
    significant). The same seed gives the same p; another seed gives the same mark unless the p lies within the
    cap's interval of alpha.

    ``rows_metric`` (``metric`` over the rows of a matrix, e.g. :func:`mice_exp.metrics.smooth_ece.smece_rows`)
    scores :data:`CHUNK` patterns a call: the same p, 3-10x faster for smECE (``benchmarks/smooth_ece.py``).
    """
    if max_permutations < 1:
        raise ValueError(f"max_permutations must be at least 1; got {max_permutations}")
    p_a, y = check_pair(p_a, y)
    p_b, _ = check_pair(p_b, y)
    observed = metric(p_a, y) - metric(p_b, y)
    if np.isnan(observed):
        return PermutationResult(float("nan"), float("nan"))
    score = _counter(metric, rows_metric, p_a, p_b, y, abs(observed) - 1e-12 * max(1.0, abs(observed)))
    differ = np.flatnonzero(p_a != p_b)
    patterns = 2 ** differ.size
    rng = np.random.default_rng(seed)
    hits = drawn = 0
    block = FIRST_BLOCK
    while drawn < max_permutations:
        if patterns <= min(drawn + block, max_permutations):
            return PermutationResult(float(observed), _exact(score, differ, y.size) / patterns, patterns, True, True)
        size = min(block, max_permutations - drawn)
        for start in range(0, size, CHUNK):  # the same stream as one draw of the whole block
            hits += score(rng.random((min(CHUNK, size - start), y.size)) < 0.5)
        drawn += size
        low, high = clopper_pearson(hits, drawn, CONFIDENCE)
        if high < alpha or low >= alpha:
            return PermutationResult(float(observed), (hits + 1) / (drawn + 1), drawn, decided=True)
        block *= 2
    return PermutationResult(float(observed), high, drawn)


def clopper_pearson(successes: int, trials: int, level: float) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided ``level`` interval of a binomial proportion."""
    from scipy.special import betaincinv  # a scikit-learn dependency; loaded only where a test runs

    tail = (1 - level) / 2
    low = 0.0 if successes == 0 else float(betaincinv(successes, trials - successes + 1, tail))
    high = 1.0 if successes == trials else float(betaincinv(successes + 1, trials - successes, 1 - tail))
    return low, high


def _exact(score: Callable[[np.ndarray], int], differ: np.ndarray, n: int) -> int:
    """How many of the 2^m swap patterns of the ``differ`` examples reach the observed |difference|."""
    count = 0
    for start in range(0, 2 ** differ.size, CHUNK):
        codes = np.arange(start, min(start + CHUNK, 2 ** differ.size))
        swaps = np.zeros((codes.size, n), dtype=bool)
        swaps[:, differ] = (codes[:, None] >> np.arange(differ.size)) & 1
        count += score(swaps)
    return count


def _counter(metric: Metric, rows_metric: RowsMetric | None, p_a: np.ndarray, p_b: np.ndarray, y: np.ndarray,
             bound: float) -> Callable[[np.ndarray], int]:
    """Counts the swap patterns (rows of a boolean matrix, at most :data:`CHUNK`) whose |permuted difference|
    reaches ``bound``: one metric call per pattern and side, or one ``rows_metric`` call for them all."""
    def count(swaps: np.ndarray) -> int:
        if rows_metric is None:
            null = np.array([metric(np.where(s, p_b, p_a), y) - metric(np.where(s, p_a, p_b), y) for s in swaps])
        else:
            scores = rows_metric(np.concatenate([np.where(swaps, p_b, p_a), np.where(swaps, p_a, p_b)]), y)
            null = scores[:len(swaps)] - scores[len(swaps):]
        return int(np.count_nonzero(np.abs(null) >= bound))
    return count
