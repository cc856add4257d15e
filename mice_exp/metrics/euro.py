"""Oracle-normalised expected utility (euro, ACUTE protocol): ETCU rescaled so the oracle scores 1.

With u_ct = 1 - u_ca rewarding a trusted correct call and u_ca an avoided wrong one, the MBR
threshold is tau = u_ca and euro_C(u_ca) = (N_tp,C + u_ca (N_tn,C - N_tp,C)) / (same for the oracle).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from mice_exp.metrics.utility import TAU_GRID, expected_utility
from mice_exp.metrics.validation import check_pair


def euro_curve(p: ArrayLike, y: ArrayLike, u_ca: ArrayLike = TAU_GRID) -> np.ndarray:
    """euro at each u_ca in [0, 1].

    Where the oracle itself gains nothing (u_ca = 0 with no correct calls, u_ca = 1 with no wrong
    ones) nothing could be gained at all, so every estimator matches the oracle: euro = 1.
    """
    p, y = check_pair(p, y)
    u_ca = np.asarray(u_ca, dtype=float)
    if np.any((u_ca < 0) | (u_ca > 1)):
        raise ValueError("every u_ca must lie in [0, 1]")
    achieved = expected_utility(p, y, u_ca, 1 - u_ca, 0.0, u_ca, 0.0)
    # The oracle executes exactly the correct calls and avoids exactly the wrong ones.
    best = ((1 - u_ca) * np.count_nonzero(y == 1) + u_ca * np.count_nonzero(y == 0)) / y.size
    return np.divide(achieved, best, out=np.ones_like(u_ca), where=best > 0)


def euro(p: ArrayLike, y: ArrayLike, u_ca: float) -> float:
    """euro at one risk level u_ca (= the threshold tau)."""
    return float(euro_curve(p, y, u_ca))


def auc_euro(p: ArrayLike, y: ArrayLike) -> float:
    """Mean euro over the same 999-point risk grid as AUC-ETCU."""
    return float(euro_curve(p, y).mean())
