"""Tool-calling data sets as :class:`Example` records, with labels, splits and demo retrieval.

``load_dataset`` turns a ``conf/dataset/*.yaml`` config into examples; the rest of the
pipeline only sees :class:`Example`, so adding a data set means adding a loader here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf.errors import MissingMandatoryValue

from mice_exp.data.bfcl import load_bfcl
from mice_exp.data.jsonl import load_jsonl
from mice_exp.data.records import Example
from mice_exp.data.splits import assign_splits, select_apis
from mice_exp.data.ste import load_ste, resolve_ste_path
from mice_exp.errors import UserError, expect

__all__ = ["DEMO_POOLS", "Example", "Selection", "demo_pool", "load_dataset", "select_examples"]

DATASETS = ("bfcl", "jsonl", "ste")
#: ``prompt.demo_pool``: where demonstrations are retrieved from. ``train``: the training split only, so no
#: validation or test answer is shown in any prompt; ``all``: every selected call but the call itself
#: (how records were made before 2026-11-25, kept to compare with).
DEMO_POOLS = ("train", "all")


def load_dataset(cfg: Mapping[str, Any], project_root: Path, cache_dir: Path) -> list[Example]:
    """Load the data set named by ``cfg["name"]``, restricted to ``cfg["apis"]`` / ``cfg["max_apis"]`` /
    ``cfg["max_per_api"]``.

    Relative paths in the config are relative to ``project_root``; downloads go to
    ``cache_dir``.
    """
    name = _get(cfg, "name")
    if name == "ste":
        path = resolve_ste_path(_get(cfg, "path"), project_root, cache_dir, _get(cfg, "url"), _get(cfg, "sha256"))
        examples, source = load_ste(path), f"dataset.path={str(path)!r}"
    elif name == "bfcl":
        examples, source = load_bfcl(_get(cfg, "categories")), f"dataset.categories={_get(cfg, 'categories')}"
    elif name == "jsonl":
        path = _get(cfg, "path")
        if path is None:
            raise UserError("dataset.path is null; expected the path of a JSON-lines file")
        examples, source = load_jsonl(project_root / Path(path)), f"dataset.path={str(path)!r}"
    else:
        raise UserError(f"dataset.name={name!r}: expected one of {list(DATASETS)}")
    expect(bool(examples), f"{source}: no examples; expected at least one tool call")
    return select_apis(examples, cfg.get("apis"), cfg.get("max_apis"), cfg.get("max_per_api"))


def _get(cfg: Mapping[str, Any], key: str) -> Any:
    """``cfg[key]``, with a missing or unset (``???``) key reported as a UserError."""
    try:
        return cfg[key]
    except (KeyError, MissingMandatoryValue) as error:
        raise UserError(f"dataset.{key} is not set; add it to the dataset config or pass dataset.{key}=...") from error


@dataclass
class Selection:
    """The examples of a run with their split names."""

    examples: list[Example]
    splits: dict[str, str]


def demo_pool(selection: Selection, pool: str) -> list[Example]:
    """The examples demonstrations are retrieved from under ``prompt.demo_pool=pool``; never one with
    no demonstration (``demo == ""``: BFCL's live_relevance, which has no gold call to show)."""
    if pool not in DEMO_POOLS:
        raise UserError(f"prompt.demo_pool={pool!r}; expected one of {', '.join(DEMO_POOLS)}")
    return [e for e in selection.examples if e.demo and (pool == "all" or selection.splits[e.id] == "train")]


def select_examples(dataset_cfg: Mapping[str, Any], paths: Any) -> Selection:
    """The configured data set's examples and their splits (``paths``: a :class:`mice_exp.paths.Paths`)."""
    examples = load_dataset(dataset_cfg, paths.root, paths.data)
    return Selection(examples, assign_splits(examples, dataset_cfg["split"], int(dataset_cfg["seed"])))
