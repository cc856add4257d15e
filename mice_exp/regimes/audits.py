"""Appendix F.3 audits: is the discovered structure more than residual noise or seed luck?"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from mice_exp.regimes.data import Triples
from mice_exp.regimes.diagnostics import regime_metrics
from mice_exp.regimes.field import MiscalibrationField


@dataclass(frozen=True)
class Audit:
    """Per-run regime metrics on the test split and their across-run mean/std (``<key>_mean``...)."""

    runs: list[dict[str, float]]
    summary: dict[str, float]


def permutation_null(
    estimator: MiscalibrationField,
    train: Triples,
    val: Triples,
    test: Triples,
    n_permutations: int = 20,
    eps: float = 0.05,
    seed: int = 0,
) -> Audit:
    """Rerun the whole pipeline (phi, grid selection, alpha) with train and validation labels
    permuted within each split; test labels stay real and only score the resulting regions.

    Permuting breaks every link between x and y but keeps each split's base rate, so the null
    field is roughly ybar - f(x): it may vary (through f), yet its regions are level sets of f
    and a calibrated model is equally calibrated on them, so the worst-slice gap should be ~0.
    """
    rng = np.random.default_rng(seed)
    runs = []
    for _ in tqdm(range(n_permutations), desc="permutation null", disable=not estimator.config.progress):
        model = estimator.clone().fit(
            train.x, train.f, rng.permutation(train.y), val.x, val.f, rng.permutation(val.y)
        )
        runs.append(regime_metrics(model.field(test.x), test.y, {"base": test.f}, eps))
    return Audit(runs, _summarise(runs))


def seed_stability(
    estimator: MiscalibrationField,
    train: Triples,
    val: Triples,
    test: Triples,
    seeds: Sequence[int] = (0, 1, 2),
    eps: float = 0.05,
) -> Audit:
    """Refit under each seed; summary adds pairwise Pearson correlation of the test fields
    (``field_corr_*``) and the fraction of test points whose field sign agrees (``sign_agreement_*``)."""
    fields = [
        estimator.clone(seed=s).fit(train.x, train.f, train.y, val.x, val.f, val.y).field(test.x)
        for s in tqdm(seeds, desc="seed stability", disable=not estimator.config.progress)
    ]
    runs = [regime_metrics(delta, test.y, {"base": test.f}, eps) for delta in fields]
    pairs = [
        {"field_corr": float(np.corrcoef(a, b)[0, 1]), "sign_agreement": float(np.mean(np.sign(a) == np.sign(b)))}
        for a, b in itertools.combinations(fields, 2)
    ]
    return Audit(runs, {**_summarise(runs), **_summarise(pairs)})


def _summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    """Mean and standard deviation of every key, ignoring NaNs (unpopulated regions)."""
    summary = {}
    for key in rows[0] if rows else ():
        values = np.array([row[key] for row in rows], dtype=float)
        finite = values[~np.isnan(values)]
        summary[f"{key}_mean"] = float(finite.mean()) if finite.size else float("nan")
        summary[f"{key}_std"] = float(finite.std()) if finite.size else float("nan")
    return summary
