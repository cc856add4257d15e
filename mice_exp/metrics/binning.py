"""Equal-width confidence bins, shared by binned ECE and the histogram estimator (MICE §4.4)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def equal_width_bins(x: ArrayLike, n_bins: int) -> np.ndarray:
    """Index of the bin [k/n, (k+1)/n) holding each x in [0, 1]; the last bin also holds 1.0.

    The edges are computed as k/n, which is the same double as the decimal literal
    (4/100 == 0.04), so a value written on an edge always lands in the upper bin.
    """
    if int(n_bins) != n_bins or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins}")
    interior_edges = np.arange(1, n_bins) / n_bins
    return np.searchsorted(interior_edges, np.asarray(x, dtype=float), side="right")
