"""A gate's probability that a call is right: the calls' records (an in-memory LLM stage) through the run's
fitted feature view, saved with the gate, then its estimator; and what of the LLM's pass the two read, so that a
scored call's pass computes nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from mice_exp.errors import UserError
from mice_exp.llm.records import StageOutput

if TYPE_CHECKING:  # annotations only
    from mice_exp.features import FeatureSet


def features(view: Any, spec: Mapping[str, Any], device: str | None, stage: StageOutput) -> FeatureSet:
    """The feature rows of an LLM-stage output through the run's fitted ``view``; a gate saved before gates kept
    their view (``view`` None: a stateless one) fits the view ``spec`` names on ``stage`` itself, as it did then."""
    from mice_exp.features import fit_features, make_view, transform_features  # loads sklearn

    if view is None:
        fresh = make_view(spec["features"], None, int(spec["seed"]))
        return fit_features(fresh.on_device(device) if device else fresh, stage)
    return transform_features(view, stage)


def reads(view: Any, estimator: Any) -> tuple[bool, bool]:
    """Whether ``view`` and ``estimator`` read the logit lens' layer strings, and the LLM's hidden-state arrays
    (their :class:`~mice_exp.needs.Needs`): a confidence-only gate reads neither, so its pass is the plain forward
    pass with the call's logits. A gate saved before gates kept their view reads both."""
    if view is None:
        return True, True
    needs = view.needs()
    if callable(getattr(estimator, "needs", None)):
        needs = needs | estimator.needs()
    return "layer_strings" in needs.record_fields, bool(needs.arrays)


def probabilities(estimator: Any, columns: Sequence[str], fs: FeatureSet) -> np.ndarray:
    """P(correct) for the rows of ``fs``, which must have the ``columns`` the estimator was fitted on."""
    if list(fs.columns) != list(columns):
        raise UserError(f"the feature view gave columns {fs.columns[:4]}...; the gate was fitted on "
                        f"{list(columns)[:4]}... ({len(columns)}); expected the same view and LLM")
    return estimator.predict_proba(estimator.design(fs))[:, 1]
