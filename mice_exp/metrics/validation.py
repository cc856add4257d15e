"""Input checks shared by every metric, so bad arrays fail loudly instead of scoring silently."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def _one_dimensional(values: ArrayLike, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name} is empty")
    return array


def check_labels(y: ArrayLike, name: str = "y") -> np.ndarray:
    """Correctness labels as an int array of 0 (incorrect) and 1 (correct)."""
    labels = _one_dimensional(y, name)
    if not np.isin(labels, (0, 1)).all():
        raise ValueError(f"{name} must contain only 0 and 1, got values {np.unique(labels)[:5]}")
    return labels.astype(int)


def check_confidences(p: ArrayLike, name: str = "p") -> np.ndarray:
    """Confidences as a float array of finite values in [0, 1]."""
    confidences = _one_dimensional(p, name).astype(float)
    if not np.isfinite(confidences).all():
        raise ValueError(f"{name} contains NaN or inf")
    if confidences.min() < 0 or confidences.max() > 1:
        raise ValueError(
            f"{name} must lie in [0, 1], got range [{confidences.min()}, {confidences.max()}]"
        )
    return confidences


def check_pair(p: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Confidences and labels for the same examples."""
    confidences, labels = check_confidences(p), check_labels(y)
    if confidences.size != labels.size:
        raise ValueError(f"p and y differ in length: {confidences.size} != {labels.size}")
    return confidences, labels
