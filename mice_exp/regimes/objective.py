"""Training loss (Eq. 4) and validation proxy (Eq. 6) for the representation map."""

from __future__ import annotations

import numpy as np
import torch

from mice_exp.regimes.kernel import Smoothed


def discovery_loss(smoothed: Smoothed, lam: float, m_min: float) -> torch.Tensor:
    """-mean delta_hat^2 + lam * mean max(0, m_min - m)^2.

    The first term rewards geometries whose local residual averages do not cancel; the second
    keeps every neighbourhood above ``m_min`` effective points so the averages stay low-variance.
    """
    shortfall = torch.relu(m_min - smoothed.mass)
    return -smoothed.delta.pow(2).mean() + lam * shortfall.pow(2).mean()


def corrected_brier(f: np.ndarray, y: np.ndarray, delta: np.ndarray) -> float:
    """Brier score of the raw additive correction f + delta_hat (appendix B).

    Under squared loss the best additive correction is E[Y - f | x], so a lower value means
    delta_hat is closer to the true field; it is comparable across sigma and lambda, unlike Eq. 4.
    """
    return float(np.mean((y - (f + delta)) ** 2))
