"""Expected tool-calling utility (MICE §3.2): the payoff of executing a call iff p > tau."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from mice_exp.metrics.validation import check_pair

#: The risk levels tau in {0.001, ..., 0.999} over which MICE averages utility (footnote 6).
TAU_GRID: np.ndarray = np.arange(1, 1000) / 1000


def mbr_threshold(tp: float, fp: float, tn: float, fn: float) -> float:
    """Minimum-Bayes-risk threshold of Eq. 2: tau = (tn - fp) / ((tp - fn) + (tn - fp)).

    Rounded to 12 decimals so that utilities written as fractions give the decimal threshold
    they stand for (fp = -1/9 gives 0.1, not 0.0999...), keeping ties p == tau on the abstain side.
    """
    if not all(np.isfinite([tp, fp, tn, fn])):
        raise ValueError(f"utilities must be finite numbers; got tp={tp}, fp={fp}, tn={tn}, fn={fn}")
    execute_gain, avoid_gain = tp - fn, tn - fp
    if execute_gain <= 0 or avoid_gain <= 0:
        raise ValueError(
            "utilities need tp > fn and tn > fp (executing a correct call must beat skipping it, "
            f"and skipping a wrong one must beat executing it); got tp={tp}, fp={fp}, tn={tn}, fn={fn}"
        )
    return round(avoid_gain / (execute_gain + avoid_gain), 12)


@dataclass(frozen=True)
class Risk:
    """Utilities of the four outcomes of a call/no-call decision, and the threshold they imply."""

    tp: float
    fp: float
    tn: float
    fn: float
    tau: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tau", mbr_threshold(self.tp, self.fp, self.tn, self.fn))


#: The three settings of MICE Table 1 (tp = 1, tn = fn = 0).
LOW = Risk(tp=1.0, fp=-1 / 9, tn=0.0, fn=0.0)
MEDIUM = Risk(tp=1.0, fp=-1.0, tn=0.0, fn=0.0)
HIGH = Risk(tp=1.0, fp=-9.0, tn=0.0, fn=0.0)
PAPER_RISKS: dict[str, Risk] = {"low": LOW, "medium": MEDIUM, "high": HIGH}


def executed_counts(p: np.ndarray, y: np.ndarray, taus: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Correct and incorrect calls executed (p > tau) at each tau.

    Sorting once and binary-searching every tau costs O((n + T) log n) instead of n * T.
    """
    taus = np.asarray(taus, dtype=float)
    correct, incorrect = np.sort(p[y == 1]), np.sort(p[y == 0])
    n_tp = correct.size - np.searchsorted(correct, taus, side="right")
    n_fp = incorrect.size - np.searchsorted(incorrect, taus, side="right")
    return n_tp, n_fp


def expected_utility(
    p: ArrayLike, y: ArrayLike, taus: ArrayLike, tp: ArrayLike, fp: ArrayLike, tn: ArrayLike, fn: ArrayLike
) -> np.ndarray:
    """Mean utility per example of "execute iff p > tau"; the utilities broadcast against taus."""
    p, y = check_pair(p, y)
    n_tp, n_fp = executed_counts(p, y, taus)
    n_fn, n_tn = np.count_nonzero(y == 1) - n_tp, np.count_nonzero(y == 0) - n_fp
    return (
        np.asarray(tp) * n_tp + np.asarray(fp) * n_fp + np.asarray(tn) * n_tn + np.asarray(fn) * n_fn
    ) / p.size


def etcu(p: ArrayLike, y: ArrayLike, risk: Risk) -> float:
    """Expected tool-calling utility of the MBR policy at one risk setting."""
    return float(expected_utility(p, y, risk.tau, risk.tp, risk.fp, risk.tn, risk.fn))


def etcu_curve(p: ArrayLike, y: ArrayLike, taus: ArrayLike = TAU_GRID) -> np.ndarray:
    """ETCU at each tau with tp = 1, tn = fn = 0 and fp = tau / (tau - 1) (Eq. 3 inverted)."""
    taus = np.asarray(taus, dtype=float)
    if np.any((taus <= 0) | (taus >= 1)):
        raise ValueError("every tau must lie strictly between 0 and 1")
    return expected_utility(p, y, taus, 1.0, taus / (taus - 1), 0.0, 0.0)


def auc_etcu(p: ArrayLike, y: ArrayLike) -> float:
    """Signed area under the ETCU curve: its mean over TAU_GRID, one number across all risks."""
    return float(etcu_curve(p, y).mean())


def etcu_rows(p: ArrayLike, y: ArrayLike, risk: Risk) -> np.ndarray:
    """``etcu(p[i], y, risk)`` for every row i of ``p`` (B x n; ``y`` is (n,) or (B, n)): the counts of
    :func:`expected_utility` by comparison instead of sorting, one pass for all rows (permutation nulls)."""
    p, y = _rows(p, y)
    executed, correct = p > risk.tau, y == 1
    n_tp, n_fp = np.count_nonzero(executed & correct, axis=1), np.count_nonzero(executed & ~correct, axis=1)
    n_fn, n_tn = np.count_nonzero(correct, axis=1) - n_tp, np.count_nonzero(~correct, axis=1) - n_fp
    return (risk.tp * n_tp + risk.fp * n_fp + risk.tn * n_tn + risk.fn * n_fn) / p.shape[1]


#: Column k: the summed false-positive utility tau / (tau - 1) of the first k taus of TAU_GRID.
_FP_BELOW = np.concatenate([[0.0], np.cumsum(TAU_GRID / (TAU_GRID - 1))])


def auc_etcu_rows(p: ArrayLike, y: ArrayLike) -> np.ndarray:
    """``auc_etcu(p[i], y)`` for every row i of ``p`` (to rounding): a call is executed at the taus below its
    confidence, so a correct one adds 1 per such tau and a wrong one the false-positive utility summed over them."""
    p, y = _rows(p, y)
    below = np.searchsorted(TAU_GRID, p, side="left")
    return np.where(y == 1, below, _FP_BELOW[below]).sum(axis=1) / (TAU_GRID.size * p.shape[1])


def _rows(p: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    p = np.atleast_2d(np.asarray(p, dtype=float))
    return p, np.broadcast_to(np.asarray(y), p.shape)
