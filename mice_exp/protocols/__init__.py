"""Which records train an estimator and which it predicts (``conf/protocol``).

A protocol knows nothing about how features are made: it receives a FeatureSet and a
way to build a fresh estimator, and returns test-row predictions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
from sklearn.base import clone

from mice_exp.data.splits import loao_folds
from mice_exp.errors import UserError
from mice_exp.features.hidden import hidden_states

if TYPE_CHECKING:  # the feature views read the LLM stage's cache; estimation only needs the type
    from mice_exp.features import FeatureSet

PROTOCOLS = ("holdout", "loao", "sample_efficiency")


def inputs(estimator, fs: FeatureSet, source: str = "raw") -> np.ndarray:
    """Calibrators see one confidence (raw by default) alone; MICE-style estimators see the feature view;
    hidden-state estimators every layer of their representation side by side (and learn how many);
    a field correction sees its base's input followed by its representation (and learns where one ends)."""
    if estimator.input_kind == "hidden":
        states = hidden_states(fs, estimator.representation)
        estimator.set_params(n_layers=states.shape[1])
        return states.reshape(len(states), -1)
    if estimator.input_kind == "field":
        base = inputs(estimator.base, fs, source)
        estimator.set_params(base_width=base.shape[1])
        return np.hstack([base, fs.representation(estimator.representation)])
    return fs.confidence_of(source)[:, None] if estimator.input_kind == "confidence" else fs.X


def holdout(estimator, fs: FeatureSet, source: str = "raw") -> tuple[np.ndarray, object]:
    """Train on the training split, predict the test split; also return the fitted estimator."""
    train, test = fs.rows("train"), fs.rows("test")
    X = inputs(estimator, fs, source)
    fitted = clone(estimator).fit(X[train], fs.labels[train])
    return fitted.predict_proba(X[test])[:, 1], fitted


def loao(estimator, fs: FeatureSet, source: str = "raw") -> tuple[np.ndarray, None]:
    """Leave one API out (MICE section 5): for each API, train on the other APIs' training rows,
    predict its test rows; the folds' predictions are pooled in test-row order (no single model)."""
    X = inputs(estimator, fs, source)
    out = np.full(len(fs.ids), np.nan)
    for fold in loao_folds(fs.apis, fs.splits):
        if fold.test:
            train, held = list(fold.train), list(fold.test)
            out[held] = clone(estimator).fit(X[train], fs.labels[train]).predict_proba(X[held])[:, 1]
    return out[fs.rows("test")], None


def get_protocol(name: str) -> Callable | None:
    """The per-estimator protocol function (None for sample_efficiency, which runs its own grid)."""
    if name not in PROTOCOLS:
        raise UserError(f"protocol.name={name!r}; expected one of {', '.join(PROTOCOLS)}")
    return {"holdout": holdout, "loao": loao}.get(name)
