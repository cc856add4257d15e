"""Per-argument confidence: value spans in the argument JSON, token products, pooled scores."""

from __future__ import annotations

import json
import math
import re

import pytest

from mice_exp.features.arguments import argument_confidences, argument_metrics, argument_spans


def test_each_top_level_value_gets_its_exact_span() -> None:
    text = 'Action: f\nAction Input: {"a": {"b": [1, 2]}, "c": "x, y" , "d":true}\nObservation'
    spans = argument_spans(text)
    assert {name: text[lo:hi] for name, (lo, hi) in spans.items()} == {"a": '{"b": [1, 2]}', "c": '"x, y"', "d": "true"}


@pytest.mark.parametrize("text", ["Action: f\nAction Input: {}", "Action: f\nAction Input: {\"a\" 1}", "no call"])
def test_calls_without_parseable_arguments_have_none(text: str) -> None:
    assert argument_spans(text) == {}


def record(id_: str, values: dict[str, tuple[str, float]]) -> dict:
    """A record whose tokens are the words and symbols of its text; each value's tokens get its probability."""
    body = ", ".join(f'"{name}": {value}' for name, (value, _) in values.items())
    text = f"Action: get_weather\nAction Input: {{{body}}}"
    offsets = [m.span() for m in re.finditer(r'\w+|[^\w\s]', text)]
    spans = argument_spans(text)
    probs = [next((p for name, (_, p) in values.items() if spans[name][0] <= lo < spans[name][1]), 1.0)
             for lo, _ in offsets]
    pred = {name: json.loads(value) for name, (value, _) in values.items()}
    return {"id": id_, "text": text, "offsets": offsets, "token_probs": probs, "pred_api": "get_weather",
            "pred_args": pred}


def test_an_argument_multiplies_the_probabilities_of_its_value_tokens() -> None:
    rec = record("x", {"city": ('"New York"', 0.5), "days": ("3", 0.9)})
    # "New York" in quotes is four tokens (" New York "), each at 0.5; 3 is one token at 0.9.
    assert argument_confidences(rec) == pytest.approx({"city": 0.5 ** 4, "days": 0.9}, abs=1e-12)  # products of 4 floats


def test_pooled_scores_rank_argument_errors_and_localize_the_wrong_argument() -> None:
    gold = {k: {"action": "get_weather", "action_input": {"city": "Paris", "days": 3}} for k in "abc"}
    records = [record("a", {"city": ('"Paris"', 0.9), "days": ("5", 0.4)}),   # days wrong and least confident
               record("b", {"city": ('"Rome"', 0.3), "days": ("3", 0.95)}),    # city wrong and least confident
               record("c", {"city": ('"Paris"', 0.8), "days": ("3", 0.7)})]    # right
    scores = argument_metrics(records, gold)
    assert scores["argument.n"] == 6 and scores["argument.accuracy"] == pytest.approx(4 / 6)
    assert scores["argument.auroc"] == 1.0 and scores["argument.localization"] == 1.0
    assert 0 <= scores["argument.smece"] <= 1


def test_calls_to_another_api_or_without_gold_arguments_are_not_scored() -> None:
    rec = record("a", {"city": ('"Paris"', 0.9)})
    scores = argument_metrics([rec], {"a": {"action": "other_api", "action_input": {"city": "Paris"}}})
    assert scores["argument.n"] == 0 and all(math.isnan(scores[k]) for k in
                                             ("argument.accuracy", "argument.auroc", "argument.smece"))
