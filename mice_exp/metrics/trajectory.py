"""A conversation's confidence against whether every one of its steps was right (multi-turn data sets).

Per-step calibration says nothing about whether a whole trajectory can be trusted, and trajectory ECE alone is
blind to resolution (a constant equal to the base rate has ECE 0), so a trajectory's confidence is scored with
proper rules (Brier, log loss) beside smECE and AUROC. Two aggregates of its steps' calibrated probabilities:
their product (the steps' errors independent) and their minimum (the weakest step decides).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from mice_exp.metrics.calibration import auroc, brier, smece

AGGREGATES = ("product", "min")
#: log loss clips probabilities to [EPS, 1 - EPS], so one confident wrong trajectory is a large, finite loss
EPS = 1e-6


def trajectories(conversations: Sequence[str], p: ArrayLike, y: ArrayLike) -> pd.DataFrame:
    """One row per conversation (in order of first appearance): its number of steps, the product and minimum of
    its steps' probabilities, and ``right`` = 1 iff every step's label is 1."""
    frame = pd.DataFrame({"conversation": list(conversations), "p": np.asarray(p, float), "y": np.asarray(y, int)})
    grouped = frame.groupby("conversation", sort=False)
    return pd.DataFrame({"steps": grouped.size(), "product": grouped["p"].prod(), "min": grouped["p"].min(),
                         "right": grouped["y"].min()}).reset_index()


def log_loss(p: ArrayLike, y: ArrayLike) -> float:
    """Mean negative log-likelihood of the labels, probabilities clipped to [EPS, 1 - EPS]."""
    p, y = np.clip(np.asarray(p, float), EPS, 1 - EPS), np.asarray(y, int)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def trajectory_scores(frame: pd.DataFrame) -> dict[str, float]:
    """``<aggregate>_<brier|log_loss|smece|auroc>`` of a :func:`trajectories` frame, with ``n`` conversations
    and ``right_rate`` (how many were right at every step)."""
    y = frame["right"].to_numpy(int)
    out = {"n": float(len(frame)), "right_rate": float(y.mean())}
    for name in AGGREGATES:
        p = frame[name].to_numpy(float)
        out |= {f"{name}_brier": brier(p, y), f"{name}_log_loss": log_loss(p, y), f"{name}_smece": smece(p, y),
                f"{name}_auroc": auroc(p, y)}
    return out
