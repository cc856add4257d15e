"""The learnable representation map phi and the input standardisation it relies on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Standardiser:
    """Per-feature affine map fitted on the training split only, so no val/test statistics leak."""

    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Standardiser:
        scale = x.std(axis=0)
        return cls(x.mean(axis=0).astype(np.float32), np.where(scale > 0, scale, 1.0).astype(np.float32))

    def __call__(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((x - self.mean) / self.scale).astype(np.float32))


class Phi(nn.Module):
    """MLP with ``n_layers`` GELU hidden layers of width ``hidden``, dropout between them, and an
    L2-normalised ``d_out`` projection: the unit sphere bounds squared distances to [0, 4], which
    gives the kernel bandwidth sigma the same meaning whatever the input dimension."""

    def __init__(self, d_in: int, hidden: int, n_layers: int, d_out: int, dropout: float = 0.1):
        super().__init__()
        layers: list[nn.Module] = []
        width = d_in
        for i in range(n_layers):
            if i > 0:
                layers.append(nn.Dropout(dropout))
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        layers.append(nn.Linear(width, d_out))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(x), dim=-1)

    @torch.no_grad()
    def embed(self, x: torch.Tensor, chunk_size: int = 4096) -> torch.Tensor:
        """Deterministic (eval-mode) embedding in chunks, restoring the previous mode afterwards."""
        was_training = self.training
        self.eval()
        z = torch.cat([self(chunk) for chunk in torch.split(x, chunk_size)])
        self.train(was_training)
        return z
