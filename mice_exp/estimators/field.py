"""A base confidence estimator plus the local correction of the miscalibration field
(Kobalczyk & van der Schaar, 2026; :mod:`mice_exp.regimes`), as one sklearn estimator.

X holds two named blocks side by side (:mod:`mice_exp.estimators.blocks`): ``base__*``, the base
estimator's own input (the raw confidence, the feature view, ...), and ``representation__*``, a
representation of the example (by default the final layer's hidden state at the last prompt token);
its ``design`` assembles them (:class:`~mice_exp.estimators.inputs.BaseAndRepresentation`), and ``fit``
learns ``base_width_`` from the names.

Fitting needs residuals y - f on points whose f the base did not see: a random forest predicts
its own training rows almost perfectly, so in-sample residuals would show no miscalibration at
all. The base's training confidences are therefore cross-fitted (out of fold); the field learns
phi on part of the training split and selects sigma, lambda and alpha on the rest (the paper's
validation split: the holdout protocol hands an estimator only its training rows); the base is
then refitted on all training rows for prediction.

The network lives in :mod:`mice_exp.regimes` (torch), imported only when a field is fitted or
diagnosed, so importing the estimators stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
from sklearn.base import clone
from sklearn.model_selection import StratifiedKFold, cross_val_predict, train_test_split

from mice_exp.estimators.base import ConfidenceEstimator
from mice_exp.estimators.blocks import blocks_of, named
from mice_exp.estimators.inputs import BaseAndRepresentation
from mice_exp.estimators.recalibration import IsotonicCalibration, TemperatureScaling

if TYPE_CHECKING:  # mice_exp.regimes trains with torch: imported when a field is fitted, not with the estimators
    from mice_exp.regimes import Diagnosis, MiscalibrationField, Triples


class FieldCorrection(ConfidenceEstimator):
    """``base``'s confidence corrected by the miscalibration field of ``representation``.

    Args:
        base: any mice_exp confidence estimator (unfitted).
        representation: what x is: "first_token" / "last_token" / "mean_pool" (an LLM-stage array,
            final layer) or "features" (the run's feature view).
        preset: "llm" (h 512, d_out 128) or "synthetic" (h 256, d_out 64) network sizes.
        field: overrides of :class:`mice_exp.regimes.FieldConfig` (sigmas, lambdas, lr, ...).
        val_fraction: share of the training rows that select sigma, lambda and alpha.
        cv: folds for the base's out-of-fold training confidences.
    """

    reads = BaseAndRepresentation()
    gate_refuses = ("a field correction holds a torch network, which a gate does not save yet; expected an "
                    "estimator without a base")

    def __init__(self, base: ConfidenceEstimator | None = None, representation: str = "first_token",
                 preset: str = "llm", field: Mapping[str, Any] | None = None, val_fraction: float = 0.25,
                 cv: int = 5, seed: int = 0):
        self.base = base
        self.representation = representation
        self.preset = preset
        self.field = field
        self.val_fraction = val_fraction
        self.cv = cv
        self.seed = seed

    def _learn_layout(self) -> None:
        blocks = blocks_of(getattr(self, "feature_names_in_", None))
        if list(blocks) != ["base", "representation"]:
            raise ValueError(f"FieldCorrection reads X as the named blocks base__* then representation__*, got "
                             f"{list(blocks) or 'no block names'}; build X with the estimator's design or "
                             "mice_exp.estimators.blocks.side_by_side")
        self.base_columns_ = blocks["base"]
        self.base_width_ = len(self.base_columns_)

    def _blocks(self, X: np.ndarray) -> tuple[Any, np.ndarray]:
        """The base's input (named as the base was fitted on it) and the representation."""
        return named(X[:, :self.base_width_], self.base_columns_), X[:, self.base_width_:]

    def _out_of_fold(self, B: np.ndarray, y: np.ndarray) -> np.ndarray:
        folds = min(self.cv, int(np.bincount(y, minlength=2).min()))
        if folds < 2:  # too few of one class to cross-fit: in-sample is all there is
            return clone(self.base).fit(B, y).predict_proba(B)[:, 1]
        split = StratifiedKFold(folds, shuffle=True, random_state=self.seed)
        return cross_val_predict(clone(self.base), B, y, cv=split, method="predict_proba")[:, 1]

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        from mice_exp.regimes import Triples, preset  # loads torch

        B, R = self._blocks(X)
        f = self._out_of_fold(B, y)
        index = np.arange(len(y))
        stratify = y if np.bincount(y, minlength=2).min() >= 2 else None
        fit, val = train_test_split(index, test_size=self.val_fraction, stratify=stratify, random_state=self.seed)
        overrides = {"seed": self.seed, "progress": False, **dict(self.field or {})}
        self.field_ = preset(self.preset, **overrides).fit(R[fit], f[fit], y[fit], R[val], f[val], y[val])
        self.train_ = Triples(R, f, y.astype(float))
        self.base_ = clone(self.base).fit(B, y)

    def base_confidence(self, X: np.ndarray) -> np.ndarray:
        """The base estimator's confidence before the correction."""
        return self.base_.predict_proba(self._blocks(np.asarray(X, dtype=np.float64))[0])[:, 1]

    def signed_field(self, X: np.ndarray) -> np.ndarray:
        """delta_hat(x): below 0 the base is overconfident near x, above 0 underconfident."""
        return self.field_.field(self._blocks(np.asarray(X, dtype=np.float64))[1])

    def _predict(self, X: np.ndarray) -> np.ndarray:
        B, R = self._blocks(X)
        return self.field_.correct(R, self.base_.predict_proba(B)[:, 1])

    def diagnose(self, X: np.ndarray, y: np.ndarray, eps: float = 0.05, min_region: int = 30) -> Diagnosis:
        """The paper's regime diagnostics on held-out rows (X built like the training X): region sizes,
        smECE per region of the base, of isotonic / temperature scaling fitted on the training rows and
        of the correction, the worst-slice gap, and the populated regions (to draw their reliability)."""
        from mice_exp.regimes import Triples, diagnose  # loads torch

        X = np.asarray(X, dtype=np.float64)
        held_out = Triples(self._blocks(X)[1], self.base_confidence(X), np.asarray(y, dtype=float))
        predictions = regime_predictions(self.field_, self.train_, held_out)
        return diagnose(self.field_.field(held_out.x), held_out.y, predictions, eps=eps, min_region=min_region)

    def selected(self) -> dict[str, float]:
        """What validation chose: bandwidth sigma, mass weight lambda, correction strength alpha."""
        return {"sigma": self.field_.sigma_, "lambda": self.field_.lambda_, "alpha": self.field_.alpha_}


def regime_predictions(field: MiscalibrationField, train: Triples, test: Triples) -> dict[str, np.ndarray]:
    """The confidences a regime diagnosis compares on ``test``: the raw f ("base"), isotonic and
    temperature scaling fitted on ``train`` (as in appendix D.6) and the field's local correction."""
    return {
        "base": test.f,
        "iso": _recalibrate(IsotonicCalibration(), train, test),
        "ts": _recalibrate(TemperatureScaling(), train, test),
        "field": field.correct(test.x, test.f),
    }


def _recalibrate(calibrator: IsotonicCalibration | TemperatureScaling, train: Triples, test: Triples) -> np.ndarray:
    fitted = calibrator.fit(train.f[:, None], train.y.astype(int))
    return fitted.predict_proba(test.f[:, None])[:, 1]
