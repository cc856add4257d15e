"""Per-API splits, API selection and leave-one-API-out folds (mice_exp.data.splits)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mice_exp.data.records import Example
from mice_exp.data.splits import SPLIT_NAMES, assign_splits, loao_folds, select_apis, split_sizes
from mice_exp.errors import UserError

STE_COUNTS = {"train": 8, "validation": 3, "test": 4}


def make_examples(sizes: dict[str, int]) -> list[Example]:
    def make(api: str, i: int) -> Example:
        query = f"{api} query {i}"
        return Example(f"t/{api}/{i}", "ste", api, query, tools="", tool_names=(), gold={}, demo="")

    return [make(api, i) for api, n in sizes.items() for i in range(n)]


EXAMPLES = make_examples({f"api{j:02d}": 15 for j in range(12)} | {"small": 7, "big": 30})


def test_split_sizes_scale_with_largest_remainder() -> None:
    assert split_sizes(15, STE_COUNTS) == {"train": 8, "validation": 3, "test": 4}
    assert split_sizes(30, STE_COUNTS) == {"train": 16, "validation": 6, "test": 8}
    # 7 * (8, 3, 4) / 15 = (3.73, 1.4, 1.87): floors 3/1/1, the 2 left go to test, then train.
    assert split_sizes(7, STE_COUNTS) == {"train": 4, "validation": 1, "test": 2}
    bfcl = {"train": 50, "validation": 20, "test": 30}
    assert split_sizes(1051, bfcl) == {"train": 526, "validation": 210, "test": 315}


@given(n=st.integers(0, 2000), counts=st.tuples(*[st.integers(0, 50)] * 3).filter(lambda c: sum(c) > 0))
def test_split_sizes_sum_to_n_and_stay_within_one_of_the_quota(n: int, counts: tuple[int, int, int]) -> None:
    mapping = dict(zip(SPLIT_NAMES, counts))
    sizes = split_sizes(n, mapping)
    assert sum(sizes.values()) == n
    for name in SPLIT_NAMES:
        quota = n * mapping[name] / sum(counts)
        assert quota - 1 < sizes[name] < quota + 1


def test_assign_splits_counts_per_api() -> None:
    splits = assign_splits(EXAMPLES, STE_COUNTS, seed=0)
    assert set(splits) == {e.id for e in EXAMPLES}
    per_api = Counter((e.api, splits[e.id]) for e in EXAMPLES)
    for api in {e.api for e in EXAMPLES}:
        n = sum(1 for e in EXAMPLES if e.api == api)
        assert {name: per_api[api, name] for name in SPLIT_NAMES} == split_sizes(n, STE_COUNTS)


def test_assign_splits_is_deterministic_and_order_free() -> None:
    splits = assign_splits(EXAMPLES, STE_COUNTS, seed=0)
    shuffled = list(EXAMPLES)
    random.Random(1).shuffle(shuffled)
    assert assign_splits(shuffled, STE_COUNTS, seed=0) == splits
    assert assign_splits(EXAMPLES, STE_COUNTS, seed=1) != splits
    # Renumbering (a reordered file) keeps each query in its split.
    renumbered = [replace(e, id=f"{e.id}-moved") for e in EXAMPLES]
    moved = assign_splits(renumbered, STE_COUNTS, seed=0)
    assert all(moved[f"{e.id}-moved"] == splits[e.id] for e in EXAMPLES)
    # Other APIs do not change an API's split.
    alone = assign_splits([e for e in EXAMPLES if e.api == "small"], STE_COUNTS, seed=0)
    assert all(splits[i] == name for i, name in alone.items())


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ({"train": 8, "test": 4}, r"dataset\.split=.*keys \['train', 'validation', 'test'\]"),
        ({"train": 8, "validation": -1, "test": 4}, r"dataset\.split\.validation=-1"),
        ({"train": 8, "validation": 2.5, "test": 4}, r"dataset\.split\.validation=2\.5"),
        ({"train": 0, "validation": 0, "test": 0}, r"sum to 0"),
    ],
)
def test_bad_split_counts(counts: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        assign_splits(EXAMPLES, counts, seed=0)


def test_the_first_examples_of_each_api_in_the_data_sets_order() -> None:
    kept = select_apis(EXAMPLES, None, None, max_per_api=2)
    assert Counter(e.api for e in kept) == {api: min(2, n) for api, n in Counter(e.api for e in EXAMPLES).items()}
    assert [e.id for e in kept if e.api == "big"] == [e.id for e in EXAMPLES if e.api == "big"][:2]
    with pytest.raises(UserError, match="max_per_api=0"):
        select_apis(EXAMPLES, None, None, max_per_api=0)


def test_select_apis() -> None:
    assert {e.api for e in select_apis(EXAMPLES, None, None)} == {e.api for e in EXAMPLES}
    assert [e.api for e in select_apis(EXAMPLES, ["small"], None)] == ["small"] * 7
    assert {e.api for e in select_apis(EXAMPLES, None, 2)} == {"api00", "api01"}
    assert {e.api for e in select_apis(EXAMPLES, ["small", "big", "api03"], 2)} == {"api03", "big"}
    with pytest.raises(UserError, match=r"unknown API 'smal'; valid ones include \['small'\] \(14 in all\)"):
        select_apis(EXAMPLES, ["smal"], None)
    with pytest.raises(UserError, match=r"dataset\.apis='small': expected a non-empty list"):
        select_apis(EXAMPLES, "small", None)
    with pytest.raises(UserError, match=r"dataset\.max_apis=0"):
        select_apis(EXAMPLES, None, 0)


def test_loao_folds_are_disjoint_and_leave_one_api_out() -> None:
    by_id = assign_splits(EXAMPLES, STE_COUNTS, seed=0)
    apis, splits = [e.api for e in EXAMPLES], [by_id[e.id] for e in EXAMPLES]
    folds = loao_folds(apis, splits)
    assert [f.held_out for f in folds] == sorted(set(apis))
    all_train = {i for i, name in enumerate(splits) if name == "train"}
    for fold in folds:
        assert not set(fold.train) & set(fold.test)
        assert all(apis[i] != fold.held_out and splits[i] == "train" for i in fold.train)
        assert all(apis[i] == fold.held_out and splits[i] == "test" for i in fold.test)
        assert set(fold.train) == {i for i in all_train if apis[i] != fold.held_out}
        size = sum(1 for e in EXAMPLES if e.api == fold.held_out)
        assert len(fold.test) == split_sizes(size, STE_COUNTS)["test"]
