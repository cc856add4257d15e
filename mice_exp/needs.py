"""What a pipeline object reads beyond its own parameters, declared so it can be checked before any model loads.

Feature views (:mod:`mice_exp.features.views`) and estimators (:mod:`mice_exp.estimators`) each say what
they need (lm-polygraph's calculators declare their dependencies the same way);
:func:`mice_exp.pipeline.check_needs` unites them, settles ``sources.use`` from them and refuses a run whose config
does not provide them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

#: The raw confidence (the LLM's own token probability of its call): every record holds it, so reading it needs
#: nothing of a run; the confidence a calibrator reads unless its ``conf/estimator`` entry names another ``source``.
RAW = "raw"


@dataclass(frozen=True)
class Needs:
    """Confidence sources (``sources.use``: p_true, verbalized, ...), LLM hidden-state arrays (first_token,
    last_token, mean_pool) and record fields (layer_strings, ...) that an object reads."""

    sources: frozenset[str] = frozenset()
    arrays: frozenset[str] = frozenset()
    record_fields: frozenset[str] = frozenset()

    @classmethod
    def of(cls, sources: Iterable[str] = (), arrays: Iterable[str] = (), record_fields: Iterable[str] = ()) -> Needs:
        return cls(frozenset(sources), frozenset(arrays), frozenset(record_fields))

    def __or__(self, other: Needs) -> Needs:
        return Needs(self.sources | other.sources, self.arrays | other.arrays, self.record_fields | other.record_fields)
