"""What every confidence estimator shares: sklearn plumbing and one guard for untrainable data."""

from __future__ import annotations

import warnings
from abc import ABCMeta, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import Tags
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from mice_exp.estimators.inputs import Reads
from mice_exp.metrics.validation import check_labels
from mice_exp.needs import RAW, Needs

if TYPE_CHECKING:  # annotations only
    import pandas as pd

    from mice_exp.features import FeatureSet


class FallbackWarning(UserWarning):
    """An estimator predicts the training base rate because it could not learn from its input."""


class ConfidenceEstimator(ClassifierMixin, BaseEstimator, metaclass=ABCMeta):
    """Binary classifier of "the call is correct" whose predict_proba[:, 1] is the confidence.

    ``reads`` declares what X is (:mod:`mice_exp.estimators.inputs`: one confidence in [0, 1], the
    feature-view matrix, every layer of an LLM hidden-state array, or a base's input beside a
    representation): :meth:`design` builds X from a run's feature set, :meth:`needs` says what the run
    must provide for it (checked with the config, before any model loads). An estimator whose X holds
    several blocks learns their layout in ``fit`` from the column names (:mod:`mice_exp.estimators.blocks`).
    Subclasses implement ``_fit(X, y)`` and ``_predict(X) -> p``;
    this class validates inputs and owns the guard: training on a single class or on NaN/inf
    features warns and falls back to predicting the training base rate for every example (the best
    constant, and never a crash mid-sweep); rows with NaN/inf at prediction time get the base rate
    too. Estimators with ``learns = False`` ignore their training data, so they skip the training check.
    """

    #: What X is: built, named and checked by this declaration, never by asking which kind it is.
    reads: ClassVar[Reads]
    #: False for estimators that ignore the training data, which therefore cannot be untrainable.
    learns: ClassVar[bool] = True
    #: Types beyond skops' defaults (numpy, scipy, scikit-learn) that a fitted instance holds: a gate trusts
    #: them when it loads one (:func:`mice_exp.gate.artifact.trusted_types`).
    holds: ClassVar[tuple[str, ...]] = ()
    #: Why a gate cannot save a fitted instance (None: it can), said before a run that would save one.
    gate_refuses: ClassVar[str | None] = None

    def design(self, fs: FeatureSet, source: str = RAW) -> np.ndarray | pd.DataFrame:
        """X for every record of ``fs`` (a :class:`~mice_exp.features.FeatureSet`), as :attr:`reads` declares it;
        ``source``: the confidence a calibrator reads (``estimator.source``)."""
        return self.reads.design(self, fs, source)

    def input_columns(self, view_columns: Sequence[str], source: str = RAW) -> list[str] | None:
        """The names of X's columns when they follow from the view's ``view_columns`` (the confidence a calibrator
        reads, the view's own), None when X names its own blocks (hidden states, a field correction's)."""
        return self.reads.columns(self, view_columns, source)

    def needs(self, source: str = RAW) -> Needs:
        """What X is made of beyond the feature view (whose own needs the view declares): the confidence
        ``source`` a calibrator reads (``estimator.source``; the raw confidence comes with every record), the
        hidden states a probe reads."""
        return self.reads.needs(self, source)

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
        self.reads.check(self, X)
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
        self.reads.check(self, X)
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
