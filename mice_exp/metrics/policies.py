"""The trivial reference policies of MICE Figure 4, written as confidences so every metric applies."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike

from mice_exp.metrics.validation import check_labels


def oracle(y: ArrayLike) -> np.ndarray:
    """p = y: executes exactly the correct calls at every risk level (the upper bound)."""
    return check_labels(y).astype(float)


def always_abstain(y: ArrayLike) -> np.ndarray:
    """p = 0: never executes, so its utility is 0 at every risk level."""
    return np.zeros(check_labels(y).size)


def always_execute(y: ArrayLike) -> np.ndarray:
    """p = 1: executes every call, optimal only when wrong calls are cheap."""
    return np.ones(check_labels(y).size)


def base_rate(y: ArrayLike) -> np.ndarray:
    """p = accuracy everywhere: executes everything until tau reaches the accuracy, then nothing."""
    labels = check_labels(y)
    return np.full(labels.size, labels.mean())


TRIVIAL_POLICIES: dict[str, Callable[[ArrayLike], np.ndarray]] = {
    "oracle": oracle,
    "always_abstain": always_abstain,
    "always_execute": always_execute,
    "base_rate": base_rate,
}
