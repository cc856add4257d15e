"""relplot's smooth ECE for many confidence vectors at once (permutation nulls, bootstrap draws).

``relplot.smECE`` costs ~20 ms per vector whatever its length: a bisection over the kernel width
(up to 11 widths) convolves a >= 1,001-point grid twice per width with ``np.convolve``. A
permutation test scores 2 x 1,000 vectors, so its null costs ~40 s. Here every row takes the
same steps as relplot (the same widths, grids, linear binning, reflected Gaussian kernel and
linear interpolation), changed only in ways that leave the arithmetic the same up to rounding:
rows at the same width are smoothed together as one matrix product, over the grid points some
row touches, straight onto the evaluation mesh (the interpolation folded into the kernel). Rows
whose width needs a grid over :data:`MAX_GRID` points (widths below ~0.005: an smECE that small)
go to relplot itself. ``tests/test_metrics.py`` checks the values against relplot's on random and
degenerate inputs; ``benchmarks/smooth_ece.py`` times both.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

#: relplot's defaults: smECE's eps, the bisection's refinements and the density's eps in ``smooth``.
EPS = 0.001
REFINE = 10
DENSITY_EPS = 0.0001
#: Rows whose kernel grid is larger go to relplot (their grid x mesh kernel matrix would pass 30 MB).
MAX_GRID = 2001


def smece_rows(p: ArrayLike, y: ArrayLike) -> np.ndarray:
    """``relplot.smECE(p[i], y[i])`` for every row i of ``p`` (B x n); ``y`` is (n,) or (B, n).

    Inputs are not checked here (callers pass vectors :func:`mice_exp.metrics.smece` accepts).
    """
    import relplot

    p = np.atleast_2d(np.asarray(p, dtype=float))
    y = np.broadcast_to(np.asarray(y, dtype=float), p.shape)
    if relplot.config.use_logit_scaling:  # another kernel than the reflected Gaussian: relplot itself
        return np.array([relplot.smECE(f, t) for f, t in zip(p, y)])
    out = np.zeros(len(p))
    live = ~exact_rows(p, y)
    if live.any():
        out[live] = _search(p[live], y[live])
    return out


def exact_rows(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The rows whose every confidence equals its label (a run whose labels and confidences are all 0 or all
    1): every residual is 0, so the smoothed gap is 0 at any kernel width and relplot's smECE is exactly 0.0,
    found only after its bisection has walked down to its narrowest widths, whose grids of ~20,000 points go
    to relplot itself (~0.5 s a row, minutes under a report's bootstrap)."""
    return np.all(p == y, axis=-1)


def _search(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """relplot.metrics.search_param(check, start=1, refine=10), one width per row, then smECE at it."""
    width = np.ones(len(p))
    searching = ~_above(p, y, width)
    start, end = np.ones(len(p)), np.zeros(len(p))
    for _ in range(REFINE):
        mid = (start + end) / 2
        holds = np.zeros(len(p), dtype=bool)
        holds[searching] = _above(p[searching], y[searching], mid[searching])
        end = np.where(searching & holds, mid, end)
        start = np.where(searching & ~holds, mid, start)
    width[searching] = start[searching]
    return _smooth_ece(p, y, width)


def _above(p: np.ndarray, y: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """relplot's bisection predicate: alpha < eps or alpha < smooth_ece(f, y, alpha)."""
    out = alpha < EPS
    rest = ~out
    out[rest] = alpha[rest] < _smooth_ece(p[rest], y[rest], alpha[rest])
    return out


def _smooth_ece(p: np.ndarray, y: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """relplot.metrics.smooth_ece(p[i], y[i], sigma[i]) per row, rows of one width together."""
    out = np.empty(len(p))
    for width in np.unique(sigma):
        rows = sigma == width
        out[rows] = _smooth_ece_at(p[rows], y[rows], float(width))
    return out


def _smooth_ece_at(f: np.ndarray, y: np.ndarray, sigma: float) -> np.ndarray:
    import relplot
    from relplot.kernels import ReflectedGaussianKernel

    grid = max(2000, round(20 / sigma)) // 2 + 1  # GaussianKernel.apply's grid
    if grid > MAX_GRID:
        return np.array([relplot.metrics.smooth_ece(a, b, sigma) for a, b in zip(f, y)])
    t = np.linspace(0, 1, max(round(10 / sigma), relplot.config.smECE_mesh_pts))
    # interpolate(t, smoothed) reads the grid at inds and inds + 1 only
    inds = (t * (grid - 1)).astype(int).clip(0, grid - 2)
    residual = (t - inds * (1 / (grid - 1))) / (1 / (grid - 1))
    read = np.unique(np.concatenate([inds, inds + 1]))
    weights = np.concatenate([f - y, np.ones_like(y)])  # ker.smooth(f, f - y, t): values, then density
    used, values = _round_to_grid(np.concatenate([f, f]), weights, grid)
    kernel = _reflected(ReflectedGaussianKernel(sigma).kernel_ev(grid), used, read)
    left = np.searchsorted(read, inds)
    at_t = values @ (kernel[:, left] * (1 - residual) + kernel[:, left + 1] * residual)  # smoothed, interpolated
    gap, density = at_t[: len(f)], at_t[len(f):] + DENSITY_EPS
    rs = gap / density
    return np.sum(np.abs(rs) * density, axis=1) / np.sum(density, axis=1)


def _round_to_grid(f: np.ndarray, y: np.ndarray, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """relplot.kernels.smooth_round_to_grid per row (each value split linearly between its two grid
    points, summed in relplot's order: every lower share, then every upper one), on the grid points
    some row touches: (those points, rows x points)."""
    bins = (f * (grid - 1)).astype(int).clip(0, grid - 2)
    frac = f * (grid - 1) - bins
    points = np.concatenate([bins.ravel(), bins.ravel() + 1])
    touched = np.zeros(grid, dtype=bool)
    touched[points] = True
    used = np.flatnonzero(touched)
    column = (np.cumsum(touched) - 1)[points]
    rows = np.tile(np.repeat(np.arange(f.shape[0]), f.shape[1]), 2)
    shares = np.concatenate([((1 - frac) * y).ravel(), (frac * y).ravel()])
    values = np.bincount(rows * len(used) + column, shares, minlength=f.shape[0] * len(used))
    return used, values.reshape(f.shape[0], len(used))


def _reflected(ker: np.ndarray, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Rows x columns of the (grid x grid) matrix of ReflectedGaussianKernel.convolve: entry (i, k) is
    what grid point i adds to smoothed[k] through the grid's three mirrored copies that np.convolve
    sums (the first copy leaves out point 0, the last point grid - 1)."""
    grid = len(ker)
    padded = np.concatenate([np.zeros(2 * grid), ker, np.zeros(2 * grid)])  # every offset below lands inside
    windows = np.lib.stride_tricks.sliding_window_view(padded, len(padded) - 4 * grid)  # [j, k] = padded[j + k]
    centre, i = grid // 2 + 2 * grid, rows[:, None]
    matrix = windows[centre - i, columns]
    first, last = rows >= 1, rows <= grid - 2
    matrix[first] += windows[centre + i[first], columns]
    matrix[last] += windows[centre + i[last] - 2 * grid + 2, columns]
    return matrix
