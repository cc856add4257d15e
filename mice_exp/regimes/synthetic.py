"""Appendix E.1 generators: 2-d inputs whose true miscalibration field is known.

The paper fixes the structure (three Gaussian clusters with logit shifts -1/0/+1; a sinusoidal
logit shift A sin(2 pi k u.x) on the unit square) but not the constants; the ones below are ours.
Clusters sit on a line orthogonal to the logit direction w so every cluster spans the same
confidence range and their opposite errors cancel in the global reliability diagram (Fig. 8b);
for the same reason the sinusoid runs along u orthogonal to w.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from mice_exp.errors import expect
from mice_exp.regimes.data import Triples

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class SyntheticData:
    """80/10/10 splits plus the ground-truth field delta(x) = eta(x) - f(x) on each split."""

    train: Triples
    val: Triples
    test: Triples
    true_field: dict[str, np.ndarray]


def three_clusters(
    n: int = 10_000,
    seed: int = 0,
    centres: tuple[tuple[float, float], ...] = ((-3.0, 0.0), (0.0, 0.0), (3.0, 0.0)),
    spread: float = 0.7,
    shifts: tuple[float, ...] = (-1.0, 0.0, 1.0),
    w: tuple[float, float] = (0.0, 1.5),
    logit_noise: float = 0.3,
) -> SyntheticData:
    """Equal-weight Gaussian clusters; cluster c's true logit is the model's logit plus shifts[c]."""
    expect(len(centres) == len(shifts), "need one logit shift per cluster centre")
    rng = np.random.default_rng(seed)
    cluster = rng.integers(len(centres), size=n)
    x = np.asarray(centres)[cluster] + spread * rng.standard_normal((n, 2))
    logit = x @ np.asarray(w) + logit_noise * rng.standard_normal(n)
    return _label_and_split(x, logit, np.asarray(shifts)[cluster], rng)


def sinusoidal(
    n: int = 10_000,
    seed: int = 0,
    amplitude: float = 0.6,
    frequency: int = 3,
    u: tuple[float, float] = (0.6, 0.8),
    w: tuple[float, float] = (4.0, -3.0),
    logit_noise: float = 0.3,
) -> SyntheticData:
    """Uniform inputs on the unit square with logit shift amplitude * sin(2 pi frequency u.x)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(n, 2))
    logit = (x - 0.5) @ np.asarray(w) + logit_noise * rng.standard_normal(n)
    shift = amplitude * np.sin(2 * np.pi * frequency * (x @ np.asarray(u)))
    return _label_and_split(x, logit, shift, rng)


def _label_and_split(x: np.ndarray, logit: np.ndarray, shift: np.ndarray, rng: np.random.Generator) -> SyntheticData:
    """f = sigm(logit), eta = sigm(logit + shift), y ~ Bernoulli(eta), random 80/10/10 split."""
    f, eta = expit(logit), expit(logit + shift)
    y = (rng.uniform(size=len(f)) < eta).astype(float)
    order = rng.permutation(len(f))
    cuts = np.split(order, [int(0.8 * len(f)), int(0.9 * len(f))])
    parts = {name: Triples(x[i], f[i], y[i]) for name, i in zip(SPLITS, cuts)}
    return SyntheticData(**parts, true_field={name: (eta - f)[i] for name, i in zip(SPLITS, cuts)})
