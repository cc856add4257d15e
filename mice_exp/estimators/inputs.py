"""What an estimator reads, declared on its class (``reads``): the one place that builds its X from a run's
feature set, says what the run must provide for it and names X's columns.

scikit-learn keeps the routing of inputs outside the estimator (``ColumnTransformer``); here each estimator class
names the kind of input it takes, and the protocols, the gate and the config check ask the estimator
(:meth:`~mice_exp.estimators.ConfidenceEstimator.design`, ``needs``, ``input_columns``), never which kind it is.
A new kind of input is a class here; a new estimator picks one. The feature set is a
:class:`mice_exp.features.FeatureSet`, read only through its methods, so the estimators import nothing of the
feature views.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np

from mice_exp.estimators.blocks import layers, named, side_by_side
from mice_exp.needs import RAW, Needs

if TYPE_CHECKING:  # annotations only
    import pandas as pd

    from mice_exp.features import FeatureSet


class Reads(ABC):
    """One kind of input; the estimator's own parameters (its ``representation``, its ``base``) say which one."""

    #: What ``gate.json`` calls it (``estimator.input_kind``), for whoever reads a saved gate.
    name: ClassVar[str]

    @abstractmethod
    def design(self, estimator: Any, fs: FeatureSet, source: str) -> np.ndarray | pd.DataFrame:
        """X, one row per record of ``fs``; ``source``: the confidence the estimator calibrates (its YAML's)."""

    def columns(self, estimator: Any, view_columns: Sequence[str], source: str) -> list[str] | None:
        """The names of X's columns when they follow from the view's (``view_columns``); None when X names its
        own blocks (:mod:`mice_exp.estimators.blocks`)."""
        return None

    def needs(self, estimator: Any, source: str) -> Needs:
        """What X is made of beyond the feature view (whose own needs the view declares)."""
        return Needs()

    def check(self, estimator: Any, X: np.ndarray) -> None:
        """What a validated X must be beyond scikit-learn's checks (nothing, unless the kind says)."""


class OneConfidence(Reads):
    """The confidence ``source`` alone, one column in [0, 1]: the calibrators and the sources used as they are."""

    name = "confidence"

    def design(self, estimator: Any, fs: FeatureSet, source: str) -> np.ndarray:
        return fs.confidence_of(source)[:, None]

    def columns(self, estimator: Any, view_columns: Sequence[str], source: str) -> list[str]:
        return [source]

    def needs(self, estimator: Any, source: str) -> Needs:
        return Needs.of(sources={source} - {RAW})  # the raw confidence comes with every record

    def check(self, estimator: Any, X: np.ndarray) -> None:
        if X.shape[1] != 1:
            raise ValueError(f"{type(estimator).__name__} takes the raw confidence as a single column, "
                             f"got {X.shape[1]} columns")
        finite = X[np.isfinite(X)]  # NaN and inf are left to the guard
        if np.any((finite < 0) | (finite > 1)):
            raise ValueError(f"{type(estimator).__name__}: confidences must lie in [0, 1]")


class ViewColumns(Reads):
    """The run's feature-view matrix, its columns as the view names them: the MICE classifiers."""

    name = "features"

    def design(self, estimator: Any, fs: FeatureSet, source: str) -> np.ndarray:
        return fs.X

    def columns(self, estimator: Any, view_columns: Sequence[str], source: str) -> list[str]:
        return list(view_columns)


class HiddenStates(Reads):
    """Every layer of the LLM-stage array ``estimator.representation`` side by side, named by layer: the probes."""

    name = "hidden"

    def design(self, estimator: Any, fs: FeatureSet, source: str) -> pd.DataFrame:
        return layers(fs.hidden_states(estimator.representation))

    def needs(self, estimator: Any, source: str) -> Needs:
        return Needs.of(arrays=[estimator.representation])


class BaseAndRepresentation(Reads):
    """``estimator.base``'s own input (named as it names its columns), then the representation
    ``estimator.representation``, as the named blocks ``base`` and ``representation``: a field correction."""

    name = "field"

    def design(self, estimator: Any, fs: FeatureSet, source: str) -> pd.DataFrame:
        base = estimator.base
        return side_by_side({"base": named(base.design(fs, source), base.input_columns(fs.columns, source)),
                             "representation": fs.representation(estimator.representation)})

    def needs(self, estimator: Any, source: str) -> Needs:
        """Its base's needs, and the LLM-stage array its representation is (unless it is the feature view)."""
        arrays = () if estimator.representation == "features" else (estimator.representation,)
        return estimator.base.needs(source) | Needs.of(arrays=arrays)

