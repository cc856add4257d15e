"""Per-API train/validation/test splits, API selection and leave-one-API-out folds.

Splits are stratified by ``Example.api`` so every API is seen in training and scored
in test, as in the MICE paper (which split STE's training data per API).
"""

from __future__ import annotations

import difflib
import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mice_exp.data.records import Example
from mice_exp.errors import UserError

SPLIT_NAMES = ("train", "validation", "test")


@dataclass(frozen=True)
class Fold:
    """Leave-one-API-out: train on the other APIs' training split, test on this API's test split."""

    held_out: str
    train: tuple[int, ...]  # row positions
    test: tuple[int, ...]  # row positions


def validate_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """Check ``dataset.split``: exactly train/validation/test, non-negative integers, sum > 0."""
    if not isinstance(counts, Mapping) or set(counts) != set(SPLIT_NAMES):
        raise UserError(f"dataset.split={counts!r}: expected a mapping with exactly the keys {list(SPLIT_NAMES)}")
    for name in SPLIT_NAMES:
        value = counts[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"dataset.split.{name}={value!r}: expected a non-negative integer")
    if sum(counts[name] for name in SPLIT_NAMES) == 0:
        raise UserError(f"dataset.split={dict(counts)!r}: the counts sum to 0; expected a positive total")
    return {name: counts[name] for name in SPLIT_NAMES}


def split_sizes(n: int, counts: Mapping[str, int]) -> dict[str, int]:
    """Split sizes for a stratum of ``n`` examples.

    A stratum whose size equals the counts' total gets the counts; any other size gets
    them scaled to ``n`` with largest-remainder rounding: each split first gets
    ``floor(n * count / total)``, then the examples left over go one each to the
    splits with the largest fractional parts, ties in train, validation, test order.
    So 8/3/4 gives 8/3/4 for 15 examples and 16/6/8 for 30; 50/20/30 are percentages.
    """
    counts = validate_counts(counts)
    total = sum(counts.values())
    sizes = {name: n * counts[name] // total for name in SPLIT_NAMES}
    by_remainder = sorted(SPLIT_NAMES, key=lambda name: -(n * counts[name] % total))  # stable: ties keep order
    for name in by_remainder[: n - sum(sizes.values())]:
        sizes[name] += 1
    return sizes


def assign_splits(examples: Sequence[Example], counts: Mapping[str, int], seed: int,
                  conversation: Callable[[Example], str] | None = None) -> dict[str, str]:
    """Map each example id to "train", "validation" or "test", stratified by API, keeping the examples of one
    ``conversation`` (default: each example alone) in one split.

    A conversation's key is its first (hash of (seed, query), id) and its stratum that example's API (a
    conversation whose examples have several APIs follows its first one). Within a stratum, conversations are
    ordered by key and cut by :func:`split_sizes` over conversations; for examples alone, they are ordered by that
    hash, ties by id. The result depends only on the seed and the examples' content: not on their order in the
    list or file, nor on which other APIs are loaded.
    """
    counts = validate_counts(counts)
    units: dict[str, list[Example]] = {}
    for example in examples:
        units.setdefault(example.id if conversation is None else conversation(example), []).append(example)
    by_api: dict[str, list[tuple[tuple[bytes, str], list[Example]]]] = {}
    for members in units.values():
        key, first = min(((_hash(seed, e.query), e.id), e) for e in members)
        by_api.setdefault(first.api, []).append((key, members))
    assignment: dict[str, str] = {}
    for stratum in by_api.values():
        ordered = [members for _, members in sorted(stratum, key=lambda unit: unit[0])]
        start = 0
        for name, size in split_sizes(len(ordered), counts).items():
            assignment.update((e.id, name) for members in ordered[start : start + size] for e in members)
            start += size
    return assignment


def _hash(seed: int, text: str) -> bytes:
    """A seeded, platform-independent sort key (Python's ``hash`` is salted per process)."""
    return hashlib.sha256(f"{seed}\0{text}".encode()).digest()


def select_apis(examples: Sequence[Example], apis: Sequence[str] | None, max_apis: int | None,
                max_per_api: int | None = None) -> list[Example]:
    """Keep the examples of ``apis`` (None: all), then of the first ``max_apis`` in sorted order, then the
    first ``max_per_api`` of each in the data set's order (a quick accuracy probe of a large category)."""
    available = sorted({e.api for e in examples})
    chosen = available
    if apis is not None:
        if isinstance(apis, str) or not isinstance(apis, Sequence) or not apis:
            raise UserError(f"dataset.apis={apis!r}: expected a non-empty list of API names or null for all")
        for name in apis:
            if name not in available:
                hints = difflib.get_close_matches(str(name), available, n=3) or available[:5]
                raise UserError(
                    f"dataset.apis: unknown API {name!r}; valid ones include {hints} ({len(available)} in all)"
                )
        chosen = sorted(set(apis))
    if max_apis is not None:
        if isinstance(max_apis, bool) or not isinstance(max_apis, int) or max_apis < 1:
            raise UserError(f"dataset.max_apis={max_apis!r}: expected a positive integer or null for all")
        chosen = chosen[:max_apis]
    keep = set(chosen)
    kept = [e for e in examples if e.api in keep]
    if max_per_api is None:
        return kept
    if isinstance(max_per_api, bool) or not isinstance(max_per_api, int) or max_per_api < 1:
        raise UserError(f"dataset.max_per_api={max_per_api!r}: expected a positive integer or null for all")
    seen: Counter[str] = Counter()
    first = []
    for example in kept:
        seen[example.api] += 1
        if seen[example.api] <= max_per_api:
            first.append(example)
    return first


def loao_folds(apis: Sequence[str], splits: Sequence[str]) -> list[Fold]:
    """One fold per API, in sorted API order, over rows given by their API and split name (the
    records' or a feature set's order); positions are increasing. The zero-shot rows of MICE Table 1."""
    rows = list(zip(apis, splits, strict=True))
    return [
        Fold(
            held_out=api,
            train=tuple(i for i, (a, split) in enumerate(rows) if a != api and split == "train"),
            test=tuple(i for i, (a, split) in enumerate(rows) if a == api and split == "test"),
        )
        for api in sorted(set(apis))
    ]
