"""Table 1's protocols: every estimator gives one confidence per test call.

``holdout`` trains on the training split and predicts the test split; ``loao`` (MICE section 5,
the "Zeroshot" rows) trains one model per API on the other APIs and pools their test predictions.
The reference rows (``compare_with``) are always fitted under holdout, the rows Table 1 displays,
so a zero-shot row's permutation marks compare it with the very predictions shown above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
from sklearn.base import clone

from mice_exp.data.splits import loao_folds
from mice_exp.errors import UserError
from mice_exp.estimation import action_belief, table, trajectory
from mice_exp.needs import RAW
from mice_exp.protocols.base import FieldRegions, Outcome, Protocol, take
from mice_exp.tracking.schema import field_key

if TYPE_CHECKING:  # annotations only
    from mice_exp.estimation import Study
    from mice_exp.features import FeatureSet


def holdout(estimator, fs: FeatureSet, source: str = RAW) -> tuple[np.ndarray, object]:
    """Train on the training split, predict the test split; also return the fitted estimator."""
    train, test = fs.rows("train"), fs.rows("test")
    X = estimator.design(fs, source)
    fitted = clone(estimator).fit(take(X, train), fs.labels[train])
    return fitted.predict_proba(take(X, test))[:, 1], fitted


def loao(estimator, fs: FeatureSet, source: str = RAW) -> tuple[np.ndarray, None]:
    """Leave one API out (MICE section 5): for each API, train on the other APIs' training rows,
    predict its test rows; the folds' predictions are pooled in test-row order (no single model)."""
    X = estimator.design(fs, source)
    out = np.full(len(fs.ids), np.nan)
    for fold in loao_folds(fs.apis, fs.splits):
        if fold.test:
            train, held = list(fold.train), list(fold.test)
            out[held] = clone(estimator).fit(take(X, train), fs.labels[train]).predict_proba(take(X, held))[:, 1]
    return out[fs.rows("test")], None


class TableProtocol(Protocol):
    """Fits the reference rows under holdout and the run's estimator under :meth:`predict`, then scores
    them all on the test split (metrics, permutation marks) into Table 1's rows."""

    def predict(self, estimator: Any, fs: FeatureSet, source: str = RAW) -> tuple[np.ndarray, Any]:
        """Test-row predictions of ``estimator`` (cloned, never modified) and the fitted model, if one."""
        raise NotImplementedError

    def run(self, study: Study, fs: FeatureSet) -> Outcome:
        y = fs.labels[fs.rows("test")]
        if len(y) == 0:
            raise UserError("the test split is empty; expected dataset.split.test > 0")
        fitted = [(c, *holdout(c.estimator, fs, c.source)) for c in study.references]
        fitted.append((study.main, *self.predict(study.main.estimator, fs, study.main.source)))
        rows = study.score(fitted, y)
        outcome = Outcome(rows=rows, text=table(rows, study.heading(self.name, len(y))))
        if "acts" in fs.sources:
            outcome.add(*action_belief(rows, fs.sources["acts"][fs.rows("test")], y))
        conversations = [r.get("conversation") for r in fs.stage.records] if fs.stage is not None else []
        if any(conversations):  # steps of multi-turn conversations: also score whole conversations
            outcome.add(*trajectory(rows, np.array(conversations, dtype=object)[fs.rows("test")], y))
        if hasattr(rows[-1].estimator, "diagnose"):
            diagnose_field(outcome, rows[-1].estimator, fs, study.main.source, study.diagnostics)
        return outcome


def diagnose_field(outcome: Outcome, estimator: Any, fs: FeatureSet, source: str, options: Mapping[str, Any]) -> None:
    """Where the base estimator is over- or underconfident on test (Kobalczyk & van der Schaar, Fig. 4-6), added
    to ``outcome``; ``source``: the confidence it reads, ``options``: ``estimator.diagnostics``."""
    if estimator.fallback_:  # it learned nothing (one training class): no field, no regions to show
        outcome.text += "\n\nmiscalibration field: not fitted (the training labels are all one class); no diagnostics"
        return
    test = fs.rows("test")
    X = estimator.design(fs, source)[test]
    diagnosis = estimator.diagnose(X, fs.labels[test], eps=float(options.get("eps", 0.05)),
                                   min_region=int(options.get("min_region", 30)))
    outcome.regions = FieldRegions(estimator.base_confidence(X), fs.labels[test], diagnosis.regions)
    over, under = diagnosis.metrics["frac_over"], diagnosis.metrics["frac_under"]
    outcome.add(f"miscalibration field on test: {over:.0%} overconfident, {under:.0%} underconfident, "
                f"worst-slice gap {diagnosis.metrics['worst_slice_gap']:.3f}; selected {estimator.selected()}",
                {field_key(k): v for k, v in diagnosis.metrics.items()} | {
                    field_key(k): v for k, v in estimator.selected().items()} | {field_key("n_test"): int(test.sum())})


class Holdout(TableProtocol):
    """Train on the training split, report on the test split (``conf/protocol/holdout.yaml``)."""

    name = "holdout"
    one_model = True

    def predict(self, estimator: Any, fs: FeatureSet, source: str = RAW) -> tuple[np.ndarray, Any]:
        return holdout(estimator, fs, source)


class Loao(TableProtocol):
    """Leave one API out: pooled predictions of per-API folds (``conf/protocol/loao.yaml``)."""

    name = "loao"

    def predict(self, estimator: Any, fs: FeatureSet, source: str = RAW) -> tuple[np.ndarray, None]:
        return loao(estimator, fs, source)
