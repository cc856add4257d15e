"""Range-aware local correction (Eq. 5): turn the field into valid probabilities without clipping."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def range_aware_correction(f: np.ndarray, delta: np.ndarray, alpha: float) -> np.ndarray:
    """f + Delta_alpha: move towards 0 by f*tanh(alpha|delta|) where delta < 0, towards 1 by
    (1-f)*tanh(alpha|delta|) otherwise. tanh < 1 keeps the step inside [-f, 1-f], so the result
    stays in [0, 1] while keeping the sign of delta and growing monotonically with its size.

    Written as f(1-t) and 1-(1-f)(1-t), algebraically the same as f - f t and f + (1-f) t, because
    products of numbers in [0, 1] cannot round outside [0, 1] while the sums can.
    """
    keep = 1.0 - np.tanh(alpha * np.abs(delta))
    return np.where(delta < 0, f * keep, 1.0 - (1.0 - f) * keep)


def select_alpha(f: np.ndarray, y: np.ndarray, delta: np.ndarray, alphas: Sequence[float]) -> float:
    """The alpha with the lowest validation Brier score of the corrected confidence.

    Ties go to the earlier grid entry, so listing 0 first prefers "no correction" when the field
    carries no usable signal.
    """
    scores = [np.mean((y - range_aware_correction(f, delta, a)) ** 2) for a in alphas]
    return float(alphas[int(np.argmin(scores))])
