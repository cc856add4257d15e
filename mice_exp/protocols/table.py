"""Table 1's protocols: every estimator gives one confidence per test call.

``holdout`` trains on the training split and predicts the test split; ``loao`` (MICE section 5,
the "Zeroshot" rows) trains one model per API on the other APIs and pools their test predictions.
The reference rows (``compare_with``) are always fitted under holdout, the rows Table 1 displays,
so a zero-shot row's permutation marks compare it with the very predictions shown above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from sklearn.base import clone

from mice_exp.data.splits import loao_folds
from mice_exp.errors import UserError
from mice_exp.estimation import table
from mice_exp.protocols.base import Outcome, Protocol, inputs, take

if TYPE_CHECKING:  # annotations only
    from mice_exp.estimation import Study
    from mice_exp.features import FeatureSet


def holdout(estimator, fs: FeatureSet, source: str = "raw") -> tuple[np.ndarray, object]:
    """Train on the training split, predict the test split; also return the fitted estimator."""
    train, test = fs.rows("train"), fs.rows("test")
    X = inputs(estimator, fs, source)
    fitted = clone(estimator).fit(take(X, train), fs.labels[train])
    return fitted.predict_proba(take(X, test))[:, 1], fitted


def loao(estimator, fs: FeatureSet, source: str = "raw") -> tuple[np.ndarray, None]:
    """Leave one API out (MICE section 5): for each API, train on the other APIs' training rows,
    predict its test rows; the folds' predictions are pooled in test-row order (no single model)."""
    X = inputs(estimator, fs, source)
    out = np.full(len(fs.ids), np.nan)
    for fold in loao_folds(fs.apis, fs.splits):
        if fold.test:
            train, held = list(fold.train), list(fold.test)
            out[held] = clone(estimator).fit(take(X, train), fs.labels[train]).predict_proba(take(X, held))[:, 1]
    return out[fs.rows("test")], None


class TableProtocol(Protocol):
    """Fits the reference rows under holdout and the run's estimator under :meth:`predict`, then scores
    them all on the test split (metrics, permutation marks) into Table 1's rows."""

    def predict(self, estimator: Any, fs: FeatureSet, source: str = "raw") -> tuple[np.ndarray, Any]:
        """Test-row predictions of ``estimator`` (cloned, never modified) and the fitted model, if one."""
        raise NotImplementedError

    def run(self, study: Study, fs: FeatureSet) -> Outcome:
        y = fs.labels[fs.rows("test")]
        if len(y) == 0:
            raise UserError("the test split is empty; expected dataset.split.test > 0")
        fitted = [(c, *holdout(c.estimator, fs, c.source)) for c in study.references]
        fitted.append((study.main, *self.predict(study.main.estimator, fs, study.main.source)))
        rows = study.score(fitted, y)
        return Outcome(rows=rows, text=table(rows, study.heading(self.name, len(y))))


class Holdout(TableProtocol):
    """Train on the training split, report on the test split (``conf/protocol/holdout.yaml``)."""

    name = "holdout"

    def predict(self, estimator: Any, fs: FeatureSet, source: str = "raw") -> tuple[np.ndarray, Any]:
        return holdout(estimator, fs, source)


class Loao(TableProtocol):
    """Leave one API out: pooled predictions of per-API folds (``conf/protocol/loao.yaml``)."""

    name = "loao"

    def predict(self, estimator: Any, fs: FeatureSet, source: str = "raw") -> tuple[np.ndarray, None]:
        return loao(estimator, fs, source)
