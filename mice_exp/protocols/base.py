"""What every protocol shares: the input routing, the object a config names, and what it returns.

A protocol (``conf/protocol/<name>.yaml``, built by :func:`make_protocol`) decides which records
train an estimator and which it predicts; it knows nothing about how features are made: it gets a
:class:`~mice_exp.features.FeatureSet` and a :class:`~mice_exp.estimation.Study` (the estimators
and how rows are scored) and returns an :class:`Outcome` that the job prints and logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import numpy as np

from mice_exp.compose import build_object
from mice_exp.features.hidden import hidden_states

if TYPE_CHECKING:  # annotations only
    from mice_exp.estimation import Row, Study
    from mice_exp.features import FeatureSet


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


@dataclass
class Outcome:
    """What a protocol hands back to the job: Table-1 rows (the run's estimator last; none for a
    protocol without one model per row), the console text, and tables and figures to log as
    artifacts (keyed by their :mod:`mice_exp.tracking.schema` artifact names)."""

    rows: list[Row] = field(default_factory=list)
    text: str = ""
    tables: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)


class Protocol:
    """A ``conf/protocol`` entry as an object: its parameters are the YAML's keys, ``name`` labels its runs."""

    name: ClassVar[str]

    def run(self, study: Study, fs: FeatureSet) -> Outcome:
        raise NotImplementedError


def make_protocol(cfg: Mapping[str, Any]) -> Protocol:
    """The protocol a ``conf/protocol`` node names with ``_target_`` (one hop); ``name`` must be its own."""
    return build_object(cfg, "protocol", Protocol, {"name": "name"})
