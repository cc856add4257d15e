"""Correctness labels on hand-written calls (mice_exp.data.labels, bfcl_checker)."""

from __future__ import annotations

from typing import Any

import pytest

from mice_exp.data.bfcl import BFCL_AST
from mice_exp.data.bfcl_checker import standardize_string
from mice_exp.data.labels import EXACT_MATCH, argument_labels, gold_api, is_correct, json_equal
from mice_exp.data.records import Example

RULES = {"ste": EXACT_MATCH, "jsonl": EXACT_MATCH, "bfcl": BFCL_AST}  # each data set's rule, as its loader gives it


def example(dataset: str, gold: Any) -> Example:
    return Example(id=f"{dataset}/x/0", dataset=dataset, api="x", query="q", tools="t", tool_names=("f",), gold=gold,
                   demo="", labels=RULES[dataset])


GOLD_ARGS = {"date": "2022-10-14", "days": 90, "opts": {"tz": ["UTC", 1]}}
STE = example("ste", {"action": "add_date", "action_input": GOLD_ARGS})


@pytest.mark.parametrize(
    ("api", "args", "expected"),
    [
        ("add_date", {"opts": {"tz": ["UTC", 1]}, "days": 90, "date": "2022-10-14"}, True),  # key order
        ("add_date", {"date": "2022-10-14", "days": 90.0, "opts": {"tz": ["UTC", 1]}}, True),  # same JSON number
        ("add_date", {**GOLD_ARGS, "days": "90"}, False),  # number as string
        ("add_date", {**GOLD_ARGS, "opts": {"tz": ["UTC", True]}}, False),  # true is not 1
        ("add_date", {**GOLD_ARGS, "opts": {"tz": [1, "UTC"]}}, False),  # list order
        ("add_date", {**GOLD_ARGS, "date": "2022-10-14 "}, False),  # strings compared exactly
        ("add_date", {"date": "2022-10-14", "days": 90}, False),  # missing argument
        ("add_date", {**GOLD_ARGS, "extra": 1}, False),  # extra argument
        ("sub_date", GOLD_ARGS, False),  # wrong API
        (None, GOLD_ARGS, False),  # unparseable generation
        ("add_date", None, False),
    ],
)
def test_ste_exact_match(api: str | None, args: dict | None, expected: bool) -> None:
    assert is_correct(STE, api, args) is expected
    jsonl = example("jsonl", STE.gold)
    assert is_correct(jsonl, api, args) is expected


def test_json_equal_whitespace_is_gone_after_parsing() -> None:
    import json

    assert json_equal(json.loads('{\n    "a": 1,\n "b": [1, 2]}'), json.loads('{"b":[1,2],"a":1}'))


BFCL = example(
    "bfcl",
    {
        "name": "area.calc",
        "parameters": {
            "type": "dict",
            "properties": {
                "base": {"type": "integer"},
                "height": {"type": "float"},
                "unit": {"type": "string"},
                "mode": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "weights": {"type": "array", "items": {"type": "float"}},
                "opts": {"type": "dict"},
                "points": {"type": "array", "items": {"type": "dict"}},
                "verbose": {"type": "boolean"},
                "unused": {"type": "string"},
            },
            "required": ["base", "height"],
        },
        "possible_answer": {
            "base": [10],
            "height": [5.0],
            "unit": ["units", ""],
            "mode": ["fast"],  # not required by the schema, but no "": must be given
            "tags": [["New York", "C"], ""],
            "weights": [[0.5, 1.0], ""],
            "opts": [{"x": [1], "y": ["", 2]}, ""],
            "points": [[{"a": [1]}, {"a": [2], "b": ["", "z"]}], ""],
            "verbose": ["", False],
        },
    },
)
MINIMAL = {"base": 10, "height": 5.0, "mode": "fast"}


@pytest.mark.parametrize(
    ("api", "args", "expected"),
    [
        ("area.calc", MINIMAL, True),  # optional ("") arguments omitted
        ("area.calc", {"mode": "fast", "height": 5.0, "base": 10}, True),  # argument order
        ("area.calc", {**MINIMAL, "height": 5}, True),  # int accepted for float
        ("area.calc", {**MINIMAL, "base": 10.0}, False),  # float not accepted for int
        ("area.calc", {**MINIMAL, "base": "10"}, False),  # number as string
        ("area.calc", {**MINIMAL, "base": True}, False),  # bool is not int
        ("area.calc", {**MINIMAL, "unit": "Units."}, True),  # BFCL string standardisation
        ("area.calc", {**MINIMAL, "unit": "inches"}, False),
        ("area.calc", {**MINIMAL, "mode": " FAST "}, True),
        ("area.calc", {"base": 10, "height": 5.0}, False),  # "mode" has no "": cannot be omitted
        ("area.calc", {"height": 5.0, "mode": "fast"}, False),  # missing required argument
        ("area.calc", {**MINIMAL, "color": "red"}, False),  # argument not in the schema
        ("area.calc", {**MINIMAL, "unused": "x"}, False),  # in the schema, not in the possible answer
        ("area.circle", MINIMAL, False),  # wrong function name
        ("area_calc", MINIMAL, False),
        ("area.calc", {**MINIMAL, "tags": ["new york", "c"]}, True),  # list element-wise, standardised
        ("area.calc", {**MINIMAL, "tags": ["C", "New York"]}, False),  # list order matters
        ("area.calc", {**MINIMAL, "tags": ["New York"]}, False),
        ("area.calc", {**MINIMAL, "tags": []}, True),  # "" stands for the empty list, as in BFCL
        ("area.calc", {**MINIMAL, "weights": [0.5, 1.0]}, True),
        # BFCL's nested type check passes trivially when "" is a candidate, so 1 == 1.0 here.
        ("area.calc", {**MINIMAL, "weights": [0.5, 1]}, True),
        ("area.calc", {**MINIMAL, "weights": [0.5, 2.0]}, False),
        ("area.calc", {**MINIMAL, "opts": {"x": 1}}, True),
        ("area.calc", {**MINIMAL, "opts": {"y": 2, "x": 1}}, True),
        ("area.calc", {**MINIMAL, "opts": {"x": 1, "z": 3}}, False),
        ("area.calc", {**MINIMAL, "opts": {"y": 2}}, False),
        ("area.calc", {**MINIMAL, "points": [{"a": 1}, {"a": 2, "b": "Z"}]}, True),
        ("area.calc", {**MINIMAL, "points": [{"a": 2}, {"a": 1}]}, False),
        ("area.calc", {**MINIMAL, "verbose": False}, True),
        ("area.calc", {**MINIMAL, "verbose": 0}, False),
        (None, MINIMAL, False),
        ("area.calc", None, False),
    ],
)
def test_bfcl_possible_answer_rules(api: str | None, args: dict | None, expected: bool) -> None:
    assert is_correct(BFCL, api, args) is expected


def test_bfcl_argument_labels_apply_the_checker_per_parameter() -> None:
    args = {**MINIMAL, "base": 10.0, "unit": "Units.", "tags": ["C", "New York"], "color": "red", "unused": "x"}
    assert argument_labels(BFCL, args) == {"base": False, "height": True, "mode": True, "unit": True,
                                           "tags": False, "color": False, "unused": False}
    assert gold_api(BFCL) == "area.calc"


@pytest.mark.parametrize("args", [MINIMAL, {**MINIMAL, "base": 10.0}, {"base": 10, "height": 5.0},
                                  {**MINIMAL, "opts": {"x": 1, "z": 3}}, {**MINIMAL, "height": 5}])
def test_a_bfcl_call_is_right_iff_each_argument_is_and_none_expected_is_missing(args: dict) -> None:
    expected_ones = [p for p, values in BFCL.gold["possible_answer"].items() if "" not in values]
    required = {*BFCL.gold["parameters"]["required"], *expected_ones}
    expected = all(argument_labels(BFCL, args).values()) and all(p in args for p in required)
    assert is_correct(BFCL, "area.calc", args) is expected


def test_ste_argument_labels_compare_each_value_with_the_gold() -> None:
    labels = argument_labels(STE, {"date": "2022-10-14", "days": "90", "extra": 1})
    assert labels == {"date": True, "days": False, "extra": False} and gold_api(STE) == "add_date"


def test_bfcl_no_int_for_float_inside_lists() -> None:
    gold = {
        "name": "f",
        "parameters": {"properties": {"w": {"type": "array", "items": {"type": "float"}}}, "required": ["w"]},
        "possible_answer": {"w": [[0.5, 1.0]]},
    }
    assert is_correct(example("bfcl", gold), "f", {"w": [0.5, 1.0]})
    assert not is_correct(example("bfcl", gold), "f", {"w": [0.5, 1]})  # as in BFCL: top level only


def test_bfcl_standardisation_matches_bfcl() -> None:
    assert standardize_string("April 1, 2024") == standardize_string("april 1 2024") == "april12024"
    assert standardize_string("it's_a-b/c*d^e.") == 'it"sabcde'


def test_a_query_without_gold_labels_nothing_right() -> None:
    query = Example.unlabelled(0, "q", "t", ("f",))  # a gate's query: its right call is unknown
    assert not is_correct(query, "f", {}) and argument_labels(query, {"x": 1}) == {} and gold_api(query) is None
