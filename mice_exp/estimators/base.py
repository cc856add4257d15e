"""What every confidence estimator shares: sklearn plumbing and one guard for untrainable data."""

from __future__ import annotations

import warnings
from abc import ABCMeta, abstractmethod
from typing import ClassVar, Literal

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import Tags
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from mice_exp.metrics.validation import check_labels
from mice_exp.needs import Needs


class FallbackWarning(UserWarning):
    """An estimator predicts the training base rate because it could not learn from its input."""


class ConfidenceEstimator(ClassifierMixin, BaseEstimator, metaclass=ABCMeta):
    """Binary classifier of "the call is correct" whose predict_proba[:, 1] is the confidence.

    ``input_kind`` says which view of the data X must be: "confidence" (one column, the raw
    confidence in [0, 1]), "features" (the feature-view matrix), "hidden" (every layer of an LLM
    hidden-state array) or "field" (a base's input beside a representation); :meth:`needs` turns it
    into what a run must provide (checked with the config, before any model loads). An estimator
    whose X holds several blocks learns their layout in ``fit`` from the column names
    (:mod:`mice_exp.estimators.blocks`). Subclasses implement ``_fit(X, y)`` and ``_predict(X) -> p``;
    this class validates inputs and owns the guard: training on a single class or on NaN/inf
    features warns and falls back to predicting the training base rate for every example (the best
    constant, and never a crash mid-sweep); rows with NaN/inf at prediction time get the base rate
    too. Estimators with ``learns = False`` ignore their training data, so they skip the training check.
    """

    input_kind: ClassVar[Literal["confidence", "features", "hidden", "field"]]
    #: False for estimators that ignore the training data, which therefore cannot be untrainable.
    learns: ClassVar[bool] = True
    #: Types beyond skops' defaults (numpy, scipy, scikit-learn) that a fitted instance holds: a gate trusts
    #: them when it loads one (:func:`mice_exp.gate.artifact.trusted_types`).
    holds: ClassVar[tuple[str, ...]] = ()

    def needs(self, source: str = "raw") -> Needs:
        """What X is made of beyond the feature view (whose own needs the view declares): the confidence
        ``source`` a calibrator reads (``estimator.source``; the raw confidence comes with every record)."""
        return Needs.of(sources={source} - {"raw"} if self.input_kind == "confidence" else ())

    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # the guard: NaN/inf rows get the training base rate
        tags.classifier_tags.multi_class = False  # "is the call correct?": labels 0 and 1
        return tags

    def fit(self, X: ArrayLike, y: ArrayLike) -> ConfidenceEstimator:
        """Learn the mapping to confidences, or fall back to the base rate (see class docstring)."""
        X, y = validate_data(self, X, y, dtype=np.float64, ensure_all_finite=False)
        check_classification_targets(y)  # a continuous y: "Unknown label type"
        if type_of_target(y) == "multiclass":
            raise ValueError(f"Only binary classification is supported: y says whether each call is correct (0 or 1); "
                             f"got {np.unique(y).size} classes")
        y = check_labels(y)
        self._check_view(X)
        self._learn_layout()
        self.classes_ = np.array([0, 1])
        self.base_rate_ = float(y.mean())
        problem = _untrainable(X, y) if self.learns else None
        self.fallback_ = problem is not None
        if self.fallback_:
            warnings.warn(
                f"{type(self).__name__}: {problem}; predicting the training base rate "
                f"{self.base_rate_:.3f} for every example",
                FallbackWarning,
                stacklevel=2,
            )
        else:
            self._fit(X, y)
        return self

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Columns [P(incorrect), P(correct)], one row per example."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64, ensure_all_finite=False)
        self._check_view(X)
        confidence = np.full(X.shape[0], self.base_rate_)
        usable = np.isfinite(X).all(axis=1)
        if not usable.all():
            warnings.warn(
                f"{type(self).__name__}: {np.count_nonzero(~usable)} rows have NaN/inf features; "
                f"they get the training base rate {self.base_rate_:.3f}",
                FallbackWarning,
                stacklevel=2,
            )
        if not self.fallback_ and usable.any():
            confidence[usable] = self._predict(X[usable])
        confidence = np.clip(confidence, 0.0, 1.0)
        return np.column_stack([1.0 - confidence, confidence])

    def predict(self, X: ArrayLike) -> np.ndarray:
        """1 where the confidence exceeds 0.5 (the medium-risk decision), else 0."""
        return (self.predict_proba(X)[:, 1] > 0.5).astype(int)

    def _check_view(self, X: np.ndarray) -> None:
        """A confidence-kind estimator reads exactly one column of probabilities."""
        if self.input_kind != "confidence":
            return
        if X.shape[1] != 1:
            raise ValueError(
                f"{type(self).__name__} takes the raw confidence as a single column, got {X.shape[1]} columns"
            )
        finite = X[np.isfinite(X)]  # NaN and inf are left to the guard
        if np.any((finite < 0) | (finite > 1)):
            raise ValueError(f"{type(self).__name__}: confidences must lie in [0, 1]")

    def _learn_layout(self) -> None:
        """Learn where the blocks of X end from ``feature_names_in_`` (estimators whose X is one block: nothing)."""

    @abstractmethod
    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        """Learn from validated data that passed the guard."""

    @abstractmethod
    def _predict(self, X: np.ndarray) -> np.ndarray:
        """Confidences for validated, finite rows."""


def _untrainable(X: np.ndarray, y: np.ndarray) -> str | None:
    """Why no estimator can learn from (X, y), or None when it can."""
    if np.unique(y).size < 2:
        return f"the training labels are all {y[0]}"
    if not np.isfinite(X).all():
        return "the training features contain NaN or inf"
    return None
