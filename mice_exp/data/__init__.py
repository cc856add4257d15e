"""Tool-calling data sets as :class:`Example` records, with labels, splits and demo retrieval.

A ``conf/dataset/*.yaml`` entry names its :class:`Dataset` class with ``_target_`` (:func:`make_dataset`); the
rest of the pipeline only sees the data set object and its :class:`Example` s, so adding a data set means adding
its module and its YAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mice_exp.data.dataset import Dataset, Selection, make_dataset
from mice_exp.data.records import Example
from mice_exp.errors import UserError
from mice_exp.paths import Paths

__all__ = ["DEMO_POOLS", "Dataset", "Example", "Selection", "demo_pool", "make_dataset", "select_examples"]

#: ``prompt.demo_pool``: where demonstrations are retrieved from. ``train``: the training split only, so no
#: validation or test answer is shown in any prompt; ``all``: every selected call but the call itself
#: (how records were made before 2026-11-25, kept to compare with).
DEMO_POOLS = ("train", "all")


def demo_pool(selection: Selection, pool: str) -> list[Example]:
    """The examples demonstrations are retrieved from under ``prompt.demo_pool=pool``; never one with
    no demonstration (``demo == ""``: BFCL's live_relevance, which has no gold call to show)."""
    if pool not in DEMO_POOLS:
        raise UserError(f"prompt.demo_pool={pool!r}; expected one of {', '.join(DEMO_POOLS)}")
    return [e for e in selection.examples if e.demo and (pool == "all" or selection.splits[e.id] == "train")]


def select_examples(dataset_cfg: Mapping[str, Any], paths: Paths) -> Selection:
    """The examples and splits of the data set a ``conf/dataset`` node names (a caller holding only the node)."""
    return make_dataset(dataset_cfg).select(paths)
