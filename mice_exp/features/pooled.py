"""ACUTE views of the activations: per-layer mean pooling and cosine to the last layer (PCA: views.PcaView)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def mean_pool(pooled: np.ndarray, layers: Sequence[int]) -> tuple[np.ndarray, list[str]]:
    """Concatenated mean-pooled vectors of the selected layers ([N, L, d] with layer i at index i-1)."""
    d = pooled.shape[2]
    return (pooled[:, [i - 1 for i in layers]].reshape(len(pooled), -1),
            [f"mean_L{i}_{j}" for i in layers for j in range(d)])


def cosine_to_last(pooled: np.ndarray, layers: Sequence[int]) -> tuple[np.ndarray, list[str]]:
    """Cosine similarity of each selected layer's pooled vector to the last layer's."""
    unit = pooled / np.maximum(np.linalg.norm(pooled, axis=2, keepdims=True), 1e-12)
    sims = np.einsum("nld,nd->nl", unit, unit[:, -1])
    return sims[:, [i - 1 for i in layers]], [f"cos_L{i}" for i in layers]
