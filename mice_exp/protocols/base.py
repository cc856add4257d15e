"""What every protocol shares: the object a config names, and what it returns.

A protocol (``conf/protocol/<name>.yaml``, built by :func:`make_protocol`) decides which records
train an estimator and which it predicts; it knows nothing about how features are made: it gets a
:class:`~mice_exp.features.FeatureSet` and a :class:`~mice_exp.estimation.Study` (the estimators
and how rows are scored) and returns an :class:`Outcome` that the job prints and logs. What each estimator reads
of the feature set is its own declaration (``estimator.design(fs, source)``, :mod:`mice_exp.estimators.inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np

from mice_exp.compose import build_object

if TYPE_CHECKING:  # annotations only
    import pandas as pd

    from mice_exp.estimation import Row, Study
    from mice_exp.features import FeatureSet


def take(X: np.ndarray | pd.DataFrame, rows: np.ndarray | list[int]) -> np.ndarray | pd.DataFrame:
    """The rows ``rows`` (a mask or positions) of an estimator's X (its ``design``: an array or a named frame)."""
    return X.iloc[rows] if hasattr(X, "iloc") else X[rows]


@dataclass
class FieldRegions:
    """Where the run's field correction finds its base over- or underconfident on the test rows: the base's
    confidence, the labels and each region's rows (the job draws one reliability diagram per region)."""

    confidence: np.ndarray
    labels: np.ndarray
    regions: dict[str, np.ndarray]


@dataclass
class Outcome:
    """What a protocol hands back to the job: Table-1 rows (the run's estimator last; none for a
    protocol without one model per row), the console text, metrics beyond the rows' (action belief, per-argument
    scores, the field diagnosis), the field's regions, and tables and figures to log as artifacts (keyed by their
    :mod:`mice_exp.tracking.schema` artifact names). The job only prints and logs it."""

    rows: list[Row] = field(default_factory=list)
    text: str = ""
    tables: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    regions: FieldRegions | None = None

    def add(self, text: str, metrics: Mapping[str, float]) -> None:
        """A section of console text and the metrics it reports."""
        self.text += "\n\n" + text
        self.metrics |= metrics


class Protocol:
    """A ``conf/protocol`` entry as an object: its parameters are the YAML's keys, ``name`` labels its runs."""

    name: ClassVar[str]
    #: Whether the run's estimator ends fitted once, on the training split: the model a gate saves (holdout).
    one_model: ClassVar[bool] = False
    #: The ``baselines`` keys it fits besides the study's rows (sample efficiency's), built once with the study.
    estimators: Sequence[str] = ()

    def check_training_calls(self, n_train: int) -> None:
        """What the number of training calls alone can refuse, before the LLM stage and the run's MLflow run
        (:meth:`mice_exp.pipeline.Pipeline.check_inputs`)."""

    def run(self, study: Study, fs: FeatureSet) -> Outcome:
        raise NotImplementedError


def make_protocol(cfg: Mapping[str, Any]) -> Protocol:
    """The protocol a ``conf/protocol`` node names with ``_target_`` (one hop); ``name`` must be its own."""
    return build_object(cfg, "protocol", Protocol, {"name": "name"})
