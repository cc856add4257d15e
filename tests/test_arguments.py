"""Per-argument confidence: value spans, token products, lens agreement, pooled scores per data set."""

from __future__ import annotations

import json
import math
import re

import pytest

from mice_exp.data.bfcl import BFCL_AST
from mice_exp.data.labels import EXACT_MATCH
from mice_exp.data.records import Example
from mice_exp.features.arguments import (
    answer_arguments,
    api_confidence,
    argument_confidences,
    argument_metrics,
    argument_spans,
    localizing_rule,
)

LAYERS = 4  # lens layers of the hand-made records


def test_each_top_level_value_gets_its_exact_span() -> None:
    text = 'Action: f\nAction Input: {"a": {"b": [1, 2]}, "c": "x, y" , "d":true}\nObservation'
    spans = argument_spans(text)
    assert {name: text[lo:hi] for name, (lo, hi) in spans.items()} == {"a": '{"b": [1, 2]}', "c": '"x, y"', "d": "true"}


@pytest.mark.parametrize("text", ["Action: f\nAction Input: {}", "Action: f\nAction Input: {\"a\" 1}", "no call"])
def test_calls_without_parseable_arguments_have_none(text: str) -> None:
    assert argument_spans(text) == {}


def record(id_: str, values: dict[str, tuple[str, float, int]], api: str = "get_weather", lens: bool = True) -> dict:
    """A record whose tokens are the words and symbols of its text; each value's tokens get its probability,
    and the logit lens of its first ``agree`` of :data:`LAYERS` layers predicts them (every layer the rest)."""
    body = ", ".join(f'"{name}": {value}' for name, (value, _, _) in values.items())
    text = f"Action: {api}\nAction Input: {{{body}}}"
    offsets = [m.span() for m in re.finditer(r'\w+|[^\w\s]', text)]
    spans = argument_spans(text)
    owner = [next((v for name, v in values.items() if spans[name][0] <= lo < spans[name][1]), ("", 1.0, LAYERS))
             for lo, _ in offsets]
    token_ids = list(range(len(offsets)))
    rec = {"id": id_, "text": text, "offsets": offsets, "token_probs": [p for _, p, _ in owner], "token_ids": token_ids,
           "pred_api": api, "pred_args": {name: json.loads(value) for name, (value, _, _) in values.items()},
           "parse_error": None}
    if lens:
        rec["lens_ids"] = [[t if layer < agree else -1 for t, (_, _, agree) in zip(token_ids, owner)]
                           for layer in range(LAYERS)]
    return rec


def test_an_argument_multiplies_the_probabilities_of_its_value_tokens() -> None:
    rec = record("x", {"city": ('"New York"', 0.5, 4), "days": ("3", 0.9, 4)})
    # "New York" in quotes is four tokens (" New York "), each at 0.5; 3 is one token at 0.9.
    assert argument_confidences(rec) == pytest.approx({"city": 0.5 ** 4, "days": 0.9}, abs=1e-12)  # products of 4 floats


def test_lens_agreement_is_the_share_of_layers_predicting_the_span_tokens() -> None:
    rec = record("x", {"city": ('"New York"', 0.5, 1), "days": ("3", 0.9, 3)})
    assert argument_confidences(rec, "lens") == {"city": 1 / 4, "days": 3 / 4}  # exact quarters
    assert api_confidence(rec, "lens") == 1.0 and api_confidence(rec) == 1.0


def test_the_api_name_has_its_own_confidence() -> None:
    rec = record("x", {"days": ("3", 0.9, 4)}, api="get_weather")
    name = [k for k, (lo, _) in enumerate(rec["offsets"]) if rec["text"][lo:].startswith("get_weather")]
    rec["token_probs"][name[0]] = 0.25
    assert api_confidence(rec) == 0.25


def ste(id_: str) -> Example:
    return Example(id=id_, dataset="ste", api="get_weather", query="q", tools="t", tool_names=("get_weather",),
                   gold={"action": "get_weather", "action_input": {"city": "Paris", "days": 3}}, demo="",
                   labels=EXACT_MATCH)


def test_pooled_scores_rank_argument_errors_and_localize_the_wrong_argument() -> None:
    examples = {k: ste(k) for k in "abcd"}
    records = [record("a", {"city": ('"Paris"', 0.9, 4), "days": ("5", 0.4, 1)}),   # days wrong and least confident
               record("b", {"city": ('"Rome"', 0.3, 2), "days": ("3", 0.95, 3)}),    # city wrong and least confident
               record("c", {"city": ('"Paris"', 0.8, 3), "days": ("3", 0.7, 4)}),    # right
               record("d", {"city": ('"Paris"', 0.9, 4)}, api="get_time")]           # another API
    scores = argument_metrics(records, examples).metrics
    assert scores["argument.n"] == 6 and scores["argument.accuracy"] == pytest.approx(4 / 6, abs=1e-12)
    assert scores["argument.auroc"] == 1.0 and scores["argument.localization"] == 1.0
    assert scores["argument.localization_chance"] == 0.5  # one of the two arguments is wrong in each such call
    assert scores["argument.lens_auroc"] == 1.0 and scores["argument.lens_localization"] == 1.0
    assert 0 <= scores["argument.smece"] <= 1 and 0 <= scores["argument.lens_smece"] <= 1
    # API names: three right, the fourth's tokens all at probability 1 like the others, so no ranking signal.
    assert scores["api_name.n"] == 4 and scores["api_name.accuracy"] == 0.75 and scores["api_name.auroc"] == 0.5


def test_a_gate_asks_about_the_argument_of_the_rule_that_localises_best_on_its_training_calls() -> None:
    examples = {k: ste(k) for k in "ab"}
    # days is wrong in both; the token product doubts city, the lens doubts days: the lens localises, 2 of 2.
    records = [record(k, {"city": ('"Paris"', 0.3, 4), "days": ("5", 0.9, 1)}) for k in "ab"]
    chosen = localizing_rule(argument_metrics(records, examples))
    assert chosen["rule"] == "lens" and chosen["calls"] == 2
    assert chosen["localization"]["lens"] == 1.0 and chosen["localization"]["product"] == 0.0
    assert answer_arguments(records[0], rule=chosen["rule"])[0] == {"city": 1.0, "days": 1 / 4}


def test_without_a_wrong_argument_to_localise_a_gate_keeps_the_token_product() -> None:
    right = record("a", {"city": ('"Paris"', 0.3, 4), "days": ("3", 0.9, 1)})
    assert localizing_rule(argument_metrics([right], {"a": ste("a")})) == {
        "rule": "product", "localization": dict.fromkeys(("product", "lens", "min_token", "mean_token")), "calls": 0}


def test_a_tie_keeps_the_token_product() -> None:
    records = [record("a", {"city": ('"Paris"', 0.9, 4), "days": ("5", 0.4, 1)})]  # every rule doubts days
    assert localizing_rule(argument_metrics(records, {"a": ste("a")}))["rule"] == "product"


def bfcl(id_: str) -> Example:
    gold = {"name": "area.calc",
            "parameters": {"properties": {"base": {"type": "integer"}, "unit": {"type": "string"}},
                           "required": ["base"]},
            "possible_answer": {"base": [10], "unit": ["units", ""]}}
    return Example(id=id_, dataset="bfcl", api="simple_python", query="q", tools="t", tool_names=("area.calc",),
                   gold=gold, demo="", labels=BFCL_AST)


def test_bfcl_arguments_are_labelled_by_its_per_parameter_rules() -> None:
    examples = {k: bfcl(k) for k in "ab"}
    records = [record("a", {"base": ("10.0", 0.3, 1), "unit": ('"Units."', 0.9, 4)}, api="area.calc"),  # float for int
               record("b", {"base": ("10", 0.8, 4), "unit": ('"inches"', 0.2, 0)}, api="area.calc")]   # unit not accepted
    scores = argument_metrics(records, examples)
    assert scores.metrics["argument.n"] == 4 and scores.metrics["argument.accuracy"] == 0.5
    assert scores.metrics["argument.auroc"] == 1.0 and scores.metrics["argument.localization"] == 1.0
    assert scores.metrics["argument.lens_auroc"] == 1.0  # the wrong ones have 1 and 0 of 4 layers agreeing
    assert set(scores.notes) == {f"api_name.{c}auroc" for c in ("", "lens_", "min_token_", "mean_token_")}  # both right


def test_records_without_lens_ids_give_nan_lens_scores_with_the_reason() -> None:
    records = [record("a", {"city": ('"Paris"', 0.9, 4), "days": ("5", 0.4, 1)}, lens=False)]
    scores = argument_metrics(records, {"a": ste("a")})
    assert scores.metrics["argument.auroc"] == 1.0 and math.isnan(scores.metrics["argument.lens_auroc"])
    assert "no lens_ids" in scores.notes["argument.lens_auroc"] and "no lens_ids" in scores.notes["api_name.lens_smece"]
    assert "argument.lens_auroc" in scores.summary() and "argument.auroc" not in scores.notes


def test_a_single_class_or_no_call_to_the_gold_api_is_nan_with_its_reason() -> None:
    right = argument_metrics([record("a", {"city": ('"Paris"', 0.9, 4), "days": ("3", 0.4, 1)})], {"a": ste("a")})
    assert math.isnan(right.metrics["argument.auroc"]) and "nothing to rank" in right.notes["argument.auroc"]
    assert "nothing to rank" in right.notes["argument.localization"]
    other = argument_metrics([record("a", {"city": ('"Paris"', 0.9, 4)}, api="other_api")], {"a": ste("a")})
    assert other.metrics["argument.n"] == 0 and "no arguments" in other.notes["argument.smece"]
    assert other.metrics["api_name.n"] == 1 and other.metrics["api_name.accuracy"] == 0


def test_an_unparseable_call_answers_no_arguments_and_says_why() -> None:
    rec = record("a", {"days": ("3", 0.9, 4)}) | {"pred_args": None, "parse_error": "invalid argument JSON: x"}
    assert answer_arguments(rec) == ({}, "no per-argument confidence: the call is unparseable (invalid argument JSON: x)")
    assert answer_arguments(record("b", {"days": ("3", 0.9, 4)})) == ({"days": 0.9}, None)
