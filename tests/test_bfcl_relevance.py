"""BFCL's relevance categories: irrelevance and live_irrelevance (right iff the reply makes no call) and
live_relevance (right iff it makes one), labelled as BFCL's ``relevance_file_runner`` labels them, and the
prompt note that offers to answer without a call (``prompt.no_call_note``, set by ``dataset=bfcl_relevance``).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import pytest

from mice_exp.compose import as_plain, compose_config
from mice_exp.config import check_values
from mice_exp.data import Selection, demo_pool, make_dataset
from mice_exp.data.bfcl import BFCL_AST, CALL_CATEGORIES, CATEGORIES, NO_CALL_DEMO, RELEVANCE_CATEGORIES, load_bfcl
from mice_exp.data.labels import argument_labels, call_expected, gold_api, is_correct
from mice_exp.data.records import Example
from mice_exp.data.splits import assign_splits
from mice_exp.errors import UserError
from mice_exp.features.arguments import argument_metrics
from mice_exp.llm.prompt import PromptBuilder, load_template, system_prompt
from mice_exp.llm.settings import PromptSettings
from mice_exp.llm.toolcall import parse_call
from mice_exp.paths import PACKAGE_ROOT, Paths
from tests.conftest import prompt_key

BFCL_NOTE = "If none of the functions can be used, point it out."
RELEVANCE = list(RELEVANCE_CATEGORIES)


@pytest.fixture(scope="module")
def relevance() -> list[Example]:
    return load_bfcl(RELEVANCE)


def label(example: Example, reply: str) -> int:
    """The LLM stage's label of a generated reply (mice_exp.llm.runner.make_record)."""
    call = parse_call(reply)
    return int(is_correct(example, call.api, call.args))


# --- loading ---------------------------------------------------------------------------


def test_the_three_categories_load_with_their_counts(relevance):
    # bfcl-eval 2026.3.23 has 240, 884 and 16 entries; 8 live_irrelevance ones with an assistant turn are left out.
    assert Counter(e.api for e in relevance) == {"irrelevance": 240, "live_irrelevance": 876, "live_relevance": 16}
    assert len({e.id for e in relevance}) == len(relevance)
    ids = {e.id for e in relevance}
    assert not ids & {f"bfcl/live_irrelevance/{i}" for i in (125, 132, 292, 296, 298, 547, 549, 553)}
    first = relevance[0]
    assert first.id == "bfcl/irrelevance/0" and first.tool_names == ("determine_body_mass_index",)
    assert first.query == "Calculate the area of a triangle given the base is 10 meters and height is 5 meters."
    assert first.gold == {"call_expected": False} and first.demo == NO_CALL_DEMO
    # Four live_irrelevance entries offer no function at all; kept, as BFCL keeps them.
    empty = [e for e in relevance if not e.tool_names]
    assert [e.id for e in empty] == [f"bfcl/live_irrelevance/{i}" for i in (120, 121, 122, 123)]
    assert all(json.loads(e.tools) == [] for e in empty)


def test_each_example_s_own_demo_is_labelled_right_and_live_relevance_has_none(relevance):
    for example in relevance:
        if example.api == "live_relevance":
            assert example.gold == {"call_expected": True} and example.demo == ""
        else:
            assert example.gold == {"call_expected": False} and label(example, example.demo) == 1


def test_a_query_with_a_system_message_keeps_it_first(relevance):
    (example,) = [e for e in relevance if e.id == "bfcl/live_relevance/6"]  # the one with a system message
    assert example.query.startswith("You are a bot owned by a courier service")
    assert example.query.endswith('call the "HANDOVER" function\n\nI have forgotten my parcel tracking number! '
                                  "What  should I do?")


def test_old_and_new_categories_load_together_and_split_per_category(tmp_path):
    cfg = {"name": "bfcl", "categories": ["simple_python", "live_relevance", "irrelevance"],
           "split": {"train": 50, "validation": 20, "test": 30}, "seed": 0}
    mixed = make_dataset(cfg | {"_target_": "mice_exp.data.bfcl.Bfcl"}).load(Paths(root=PACKAGE_ROOT, cache=tmp_path))
    assert Counter(e.api for e in mixed) == {"simple_python": 400, "live_relevance": 16, "irrelevance": 240}
    splits = assign_splits(mixed, cfg["split"], 0)
    alone = load_bfcl(["simple_python"])
    assert {e.id: splits[e.id] for e in alone} == assign_splits(alone, cfg["split"], 0)  # unchanged by the others
    live = Counter(splits[e.id] for e in mixed if e.api == "live_relevance")
    assert live == {"train": 8, "validation": 3, "test": 5}
    assert {call_expected(e) for e in mixed} == {None, True, False}


def test_live_relevance_is_never_a_demonstration(relevance):
    splits = assign_splits(relevance, {"train": 50, "validation": 20, "test": 30}, 0)
    selection = Selection(relevance, splits)
    for pool in ("train", "all"):
        shown = Counter(e.api for e in demo_pool(selection, pool))
        assert "live_relevance" not in shown and shown["irrelevance"] > 0 and shown["live_irrelevance"] > 0
    assert len(demo_pool(selection, "all")) == 240 + 876


def test_unknown_categories_are_one_line_listing_the_choices():
    with pytest.raises(UserError, match=r"unknown category 'relevance'.*'live_irrelevance', 'live_relevance'\]$"):
        load_bfcl(["irrelevance", "relevance"])
    with pytest.raises(UserError, match=r"^dataset\.categories: unknown category 'parallel'; expected some of "
                                        r"\['simple_python', .*, 'live_relevance'\]$"):  # before anything loads
        make_dataset(as_plain(compose_config(["dataset=bfcl", "dataset.categories=[parallel]"]))["dataset"])
    make_dataset(as_plain(compose_config(["dataset=bfcl", f"dataset.categories=[{','.join(CATEGORIES)}]"]))["dataset"])
    assert CATEGORIES == CALL_CATEGORIES + tuple(RELEVANCE_CATEGORIES)


# --- labels ----------------------------------------------------------------------------


def example(call_expected_: bool) -> Example:
    return Example(id="bfcl/x/0", dataset="bfcl", api="x", query="q", tools="[]", tool_names=("some_tool",),
                   gold={"call_expected": call_expected_}, demo="", labels=BFCL_AST)


IRRELEVANCE, LIVE_RELEVANCE = example(False), example(True)


@pytest.mark.parametrize(
    ("reply", "irrelevance"),
    [
        (NO_CALL_DEMO, 1),  # plain text: BFCL's decoder fails, so no call
        ("", 1),
        ("Final Answer: I cannot do that with these tools.", 1),
        ('Action: some_tool\nAction Input: {"city": "Boston"}', 0),  # a call
        ("Action: some_tool\nAction Input: {}", 0),  # no arguments is still a call (BFCL: [{"f": {}}])
        ('Action: not_offered\nAction Input: {"x": 1}', 0),  # BFCL checks no name: any call fails irrelevance
        ('I will look it up.\nAction: some_tool\nAction Input: {"x": 1}', 0),
        ('Action: some_tool\nAction Input: {"city": Boston}', 1),  # input that does not decode: no call, as in BFCL
        ('Action: some_tool\nAction Input: {"city": "Boston"', 1),  # unclosed
        ("Action: some_tool", 1),  # no Action Input
        ("Action: None", 1),
    ],
)
def test_labels_mirror_bfcl_s_relevance_checker(reply, irrelevance):
    """irrelevance passes iff the reply decodes to no call; live_relevance is its exact opposite."""
    assert label(IRRELEVANCE, reply) == irrelevance
    assert label(LIVE_RELEVANCE, reply) == 1 - irrelevance


def test_the_call_categories_keep_their_labels():
    gold = {"name": "f", "parameters": {"properties": {"x": {"type": "integer"}}, "required": ["x"]},
            "possible_answer": {"x": [1]}}
    call = Example(id="bfcl/simple_python/0", dataset="bfcl", api="simple_python", query="q", tools="[]",
                   tool_names=("f",), gold=gold, demo="", labels=BFCL_AST)
    assert call_expected(call) is None and gold_api(call) == "f"
    assert label(call, 'Action: f\nAction Input: {"x": 1}') == 1
    assert label(call, 'Action: g\nAction Input: {"x": 1}') == 0
    assert label(call, NO_CALL_DEMO) == 0  # no call is never right where a call is expected


def test_relevance_examples_have_no_gold_arguments_and_per_argument_scores_skip_them():
    assert gold_api(IRRELEVANCE) is None and argument_labels(IRRELEVANCE, {"x": 1}) == {}
    text = 'Action: some_tool\nAction Input: {"x": 1}'
    offsets = [m.span() for m in re.finditer(r"\w+|[^\w\s]", text)]
    record = {"id": "bfcl/x/0", "text": text, "offsets": offsets, "token_probs": [0.5] * len(offsets),
              "token_ids": list(range(len(offsets))), "pred_api": "some_tool", "pred_args": {"x": 1},
              "parse_error": None}
    scores = argument_metrics([record], {"bfcl/x/0": IRRELEVANCE})
    assert scores.metrics["argument.n"] == 0 and scores.metrics["api_name.n"] == 0
    assert math.isnan(scores.metrics["argument.auroc"]) and "no arguments" in scores.notes["argument.auroc"]


# --- the prompt note -------------------------------------------------------------------


def prompt_cfg(*overrides: str) -> dict:
    return as_plain(compose_config(list(overrides)))["prompt"]


def test_bfcl_relevance_sets_bfcl_s_note_and_every_other_data_set_has_none():
    assert prompt_cfg("dataset=bfcl_relevance")["no_call_note"] == BFCL_NOTE
    assert prompt_cfg("dataset=bfcl_relevance", "prompt.no_call_note=null")["no_call_note"] is None
    for dataset in ("ste", "bfcl"):
        assert prompt_cfg(f"dataset={dataset}")["no_call_note"] is None
    assert as_plain(compose_config(["dataset=bfcl_relevance"]))["dataset"]["categories"] == RELEVANCE


def test_bfcl_relevance_is_zero_shot_so_the_prompt_shows_only_the_entry_s_own_functions(tmp_path, relevance,
                                                                                        tokenizer):
    from mice_exp.paths import Paths
    from tests.conftest import stage_of

    cfg = as_plain(compose_config(["dataset=bfcl_relevance", "dataset.max_per_api=5"]))
    assert cfg["prompt"]["k_demos"] == 0 and as_plain(compose_config([]))["prompt"]["k_demos"] == 8
    stage = stage_of(cfg, Paths(root=PACKAGE_ROOT, cache=tmp_path))
    selection = stage.selection
    demos = stage.demos(tmp_path)  # no encoder loaded, nothing retrieved
    assert demos == {e.id: [] for e in selection.examples}
    example = selection.examples[0]
    head = PromptBuilder.from_config(PromptSettings.from_config(cfg["prompt"]), tokenizer).messages(example, [])
    assert len(head) == 2 and example.tools in head[0]["content"] and BFCL_NOTE in head[0]["content"]


def test_the_note_follows_the_system_text_when_set_and_changes_nothing_when_null(relevance, tokenizer):
    cfg = prompt_cfg()
    system = load_template(cfg["system"]).strip()
    without = {k: v for k, v in cfg.items() if k != "no_call_note"}
    assert system_prompt(PromptSettings.from_config(cfg)) == system == system_prompt(PromptSettings.from_config(without))
    assert system_prompt(PromptSettings.from_config(cfg | {"no_call_note": BFCL_NOTE})) == f"{system} {BFCL_NOTE}"
    noted = PromptBuilder.from_config(PromptSettings.from_config(cfg | {"no_call_note": BFCL_NOTE}), tokenizer)
    query, demos = relevance[1], relevance[2:4]
    chat = noted.messages(query, demos)
    assert chat[0]["content"].startswith(f"{system} {BFCL_NOTE}\n\nYour task is")
    assert chat[2]["content"] == NO_CALL_DEMO  # a demonstration turn: the reply with no call
    assert noted.text(query, demos).startswith(f"{system} {BFCL_NOTE}\n\n")
    assert BFCL_NOTE not in PromptBuilder.from_config(PromptSettings.from_config(cfg), tokenizer).text(query, demos)


def test_a_null_note_builds_the_same_tokens_and_key_as_before_the_note_existed(relevance, tokenizer):
    cfg = prompt_cfg()
    before = {k: v for k, v in cfg.items() if k != "no_call_note"}
    query, demos = relevance[0], relevance[1:3]
    ids = PromptBuilder.from_config(PromptSettings.from_config(cfg), tokenizer).build(query, demos, 8000).ids
    assert ids == PromptBuilder.from_config(PromptSettings.from_config(before), tokenizer).build(query, demos, 8000).ids
    noted = PromptBuilder.from_config(PromptSettings.from_config(cfg | {"no_call_note": BFCL_NOTE}),
                                      tokenizer).build(query, demos, 8000).ids
    assert len(noted) > len(ids) and tokenizer.decode(noted).count(BFCL_NOTE) == 1
    assert prompt_key(cfg) == prompt_key(before) and "no_call_note" not in prompt_key(cfg)
    assert prompt_key(cfg | {"no_call_note": BFCL_NOTE})["no_call_note"] == BFCL_NOTE


def test_the_note_is_hashed_once_in_the_stage_key(relevance):
    from tests.conftest import stage_of

    plain = as_plain(compose_config(["dataset=bfcl_relevance"]))
    selection = Selection(relevance, assign_splits(relevance, plain["dataset"]["split"], 0))
    key = stage_of(plain, selection=selection).key("cpu")
    assert key["prompt"]["no_call_note"] == BFCL_NOTE and "no_call_note" not in key["dataset"]
    off = stage_of(plain | {"prompt": plain["prompt"] | {"no_call_note": None}}, selection=selection).key("cpu")
    assert off != key and "no_call_note" not in off["prompt"]


@pytest.mark.parametrize("note", [5, "", "   ", ["a"]])
def test_a_note_that_is_not_a_non_empty_string_is_one_line(note):
    cfg = as_plain(compose_config([]))
    cfg["prompt"]["no_call_note"] = note
    with pytest.raises(UserError, match=rf"^prompt\.no_call_note={re.escape(repr(note))}; expected null or a "
                                        r"non-empty string$"):
        check_values(cfg)
