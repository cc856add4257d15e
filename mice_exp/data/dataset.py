"""A data set as one object (``conf/dataset/*.yaml`` names its class with ``_target_``): it loads its examples,
splits them, and labels calls against their gold (:class:`~mice_exp.data.records.Labels`).

A new data set is a module with a :class:`Dataset` subclass and a YAML naming it; nothing outside
:mod:`mice_exp.data` asks which data set it is (``tests/test_data_seam.py`` adds one from a temporary module).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from mice_exp.compose import build_object
from mice_exp.data.records import Example, Labels
from mice_exp.data.splits import assign_splits, select_apis, validate_counts
from mice_exp.errors import expect
from mice_exp.paths import Paths

log = logging.getLogger(__name__)

#: Keys of a ``conf/dataset`` entry that are not the data set's constructor arguments: its label (``name``,
#: checked against the class's), and the prompt settings it suggests, which ``conf/prompt`` reads from it
#: (``k_demos``: BFCL's zero-shot relevance categories; ``no_call_note``: BFCL's "point it out" sentence).
NODE_LABELS: dict[str, str | None] = {"name": "name", "k_demos": None, "no_call_note": None}
#: Keys that say where a data set's file is, not what it holds: left out of the LLM stage's key, so a moved
#: file keeps its cache (its examples are hashed anyway).
WHERE = ("_target_", "path", "url", "no_call_note")


@dataclass
class Selection:
    """The examples of a run with their split names."""

    examples: list[Example]
    splits: dict[str, str]


class Dataset(Labels):
    """Loading, selection, splits and labels of one data set. Subclasses set :attr:`name` and implement
    :meth:`load` and the labelling methods of :class:`Labels` (every example they load carries ``labels=self``).

    ``split``: per-stratum counts or proportions (:func:`mice_exp.data.splits.split_sizes`); ``apis`` /
    ``max_apis`` / ``max_per_api``: which strata and how many examples of each (:func:`select_apis`).
    """

    name: ClassVar[str]

    def __init__(self, split: Mapping[str, int], seed: int = 0, apis: list[str] | None = None,
                 max_apis: int | None = None, max_per_api: int | None = None) -> None:
        self.split = validate_counts(split)
        self.seed, self.apis, self.max_apis, self.max_per_api = int(seed), apis, max_apis, max_per_api
        self.settings: dict[str, Any] = {}  # the conf/dataset node it was built from (make_dataset)
        self.skipped: Counter[str] = Counter()  # items load() left out, by reason: reported, never dropped silently

    def load(self, paths: Paths) -> list[Example]:
        """Every example of the data set, in its files' order (relative paths are relative to ``paths.root``;
        downloads go to ``paths.data``). A broken file is a one-line UserError; an item that cannot be used is
        counted in :attr:`skipped` by reason (:meth:`select` reports them), never dropped silently."""
        raise NotImplementedError

    def source(self) -> str:
        """What the examples were read from, for the line that says there are none."""
        return f"dataset={self.name}"

    def conversation(self, example: Example) -> str:
        """The unit no split may cut: each example alone, unless a data set's examples are steps of one
        conversation."""
        return example.id

    def select(self, paths: Paths) -> Selection:
        """The run's examples (:meth:`load`, cut by ``apis`` / ``max_apis`` / ``max_per_api``) and their splits,
        stratified by ``api``, no conversation in two splits."""
        examples = self.load(paths)
        if self.skipped:
            log.warning("%s: %d items skipped (%s); %d examples kept", self.source(), sum(self.skipped.values()),
                        ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())), len(examples))
        expect(bool(examples), f"{self.source()}: no examples; expected at least one tool call")
        examples = select_apis(examples, self.apis, self.max_apis, self.max_per_api)
        return Selection(examples, assign_splits(examples, self.split, self.seed, self.conversation))

    def key(self) -> dict[str, Any]:
        """What the LLM stage's key hashes of the data set: its settings, less where its files are (and
        ``max_per_api`` when unset, so caches made before it existed keep their keys)."""
        return {k: v for k, v in self.settings.items()
                if k not in WHERE and not (k == "max_per_api" and v is None)}


def make_dataset(node: Mapping[str, Any]) -> Dataset:
    """The :class:`Dataset` a ``conf/dataset`` node names with ``_target_``, built in one hop; a bad setting
    is one line naming the group."""
    dataset = build_object(node, "dataset", Dataset, NODE_LABELS)
    dataset.settings = dict(node)
    return dataset
