"""Validated (x, f, y) triples: the only input the field estimator ever sees."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mice_exp.errors import expect


@dataclass(frozen=True)
class Triples:
    """Representations ``x`` (n x D), confidences ``f`` in [0, 1], binary outcomes ``y``.

    Checked once at construction so every downstream function can trust shapes and ranges.
    """

    x: np.ndarray
    f: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        x = np.asarray(self.x, dtype=np.float32)
        f = np.asarray(self.f, dtype=np.float64).reshape(-1)
        y = np.asarray(self.y, dtype=np.float64).reshape(-1)
        expect(x.ndim == 2, f"x must be a 2-d array (n x D), got shape {x.shape}")
        expect(len(x) == len(f) == len(y), f"x, f, y lengths differ: {len(x)}, {len(f)}, {len(y)}")
        expect(len(x) > 0, "need at least one (x, f, y) triple")
        expect(bool(np.all(np.isfinite(x))), "x contains NaN or infinite values")
        expect(bool(np.all((f >= 0) & (f <= 1))), "confidences f must lie in [0, 1]")
        expect(bool(np.all((y == 0) | (y == 1))), "outcomes y must be 0 or 1")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "f", f)
        object.__setattr__(self, "y", y)

    def __len__(self) -> int:
        return len(self.f)

    @property
    def residual(self) -> np.ndarray:
        """r = y - f; its conditional mean given x is the miscalibration field."""
        return self.y - self.f
