"""dataset=when2call: When2Call's items, its behaviour labels, splits by source and a run on tiny_random."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from conftest import tiny_run
from mice_exp.compose import as_plain, compose_config
from mice_exp.data import make_dataset
from mice_exp.data.labels import argument_labels, call_expected, gold_api, is_correct
from mice_exp.data.when2call import SHARED_RELATIVE_PATH
from mice_exp.errors import UserError
from mice_exp.paths import PACKAGE_ROOT, Paths

#: Nine items of When2Call's test set (three per class, CC-BY-4.0) and one whose tool is not JSON.
TINY = PACKAGE_ROOT / "tests" / "fixtures" / "when2call_tiny.jsonl"
REAL = PACKAGE_ROOT / SHARED_RELATIVE_PATH


def when2call(tmp_path: Path, *overrides: str):
    cfg = as_plain(compose_config(["dataset=when2call", f"dataset.path={TINY}", *overrides]))
    dataset = make_dataset(cfg["dataset"])
    return dataset, dataset.select(Paths(root=PACKAGE_ROOT, cache=tmp_path))


def test_items_load_with_their_class_and_a_broken_one_is_counted(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        dataset, selection = when2call(tmp_path)
    assert Counter(e.api for e in selection.examples) == {"tool_call": 3, "request_for_info": 3, "cannot_answer": 3}
    assert dataset.skipped == {"malformed (JSONDecodeError)": 1}
    assert "1 items skipped (1 malformed (JSONDecodeError)); 9 examples kept" in caplog.text
    call = next(e for e in selection.examples if e.api == "tool_call")
    assert call.gold["call"]["name"] in call.tool_names and call.demo.startswith("Action: ")
    assert all(e.schemas for e in selection.examples if e.tool_names)  # BFCL-style tools as JSON schemas


def test_a_reply_is_right_when_it_makes_the_item_s_move(tmp_path):
    _, selection = when2call(tmp_path)
    call = next(e for e in selection.examples if e.api == "tool_call")
    ask = next(e for e in selection.examples if e.api == "request_for_info")
    name, arguments = call.gold["call"]["name"], call.gold["call"]["arguments"]
    assert is_correct(call, name, arguments) and is_correct(call, name, {})  # the target tool, any arguments
    assert not is_correct(call, None, None) and not is_correct(call, "another_tool", arguments)
    assert argument_labels(call, {**arguments, "extra": 1}) == {**{k: True for k in arguments}, "extra": False}
    assert gold_api(call) == name and call_expected(call) is None
    assert is_correct(ask, None, None) and not is_correct(ask, ask.tool_names[0], {})  # asking: no call
    assert gold_api(ask) is None and call_expected(ask) is False and argument_labels(ask, {"x": 1}) == {}


def test_a_file_that_is_not_when2call_is_one_line(tmp_path):
    bad = tmp_path / "w.jsonl"
    bad.write_text('{"question": 1}\nnot json\n')
    with pytest.raises(UserError, match=r"w\.jsonl:2: not valid JSON .*; expected one When2Call item per line"):
        make_dataset(as_plain(compose_config(["dataset=when2call", f"dataset.path={bad}"]))["dataset"]).load(
            Paths(root=PACKAGE_ROOT, cache=tmp_path))
    with pytest.raises(UserError, match=r"^dataset=when2call: cannot read .*nope\.jsonl"):
        make_dataset(as_plain(compose_config(["dataset=when2call", "dataset.path=nope.jsonl"]))["dataset"]).load(
            Paths(root=PACKAGE_ROOT, cache=tmp_path))


@pytest.mark.skipif(not REAL.is_file(), reason=f"When2Call's test set not at {REAL}")
def test_the_test_set_splits_by_source_so_no_source_crosses_splits(tmp_path):
    dataset = make_dataset(as_plain(compose_config(["dataset=when2call"]))["dataset"])
    selection = dataset.select(Paths(root=PACKAGE_ROOT, cache=tmp_path))
    assert len(selection.examples) == 300 and not dataset.skipped
    assert Counter(e.api for e in selection.examples) == {"tool_call": 100, "request_for_info": 100,
                                                          "cannot_answer": 100}
    splits_of: dict[str, set[str]] = {}
    for e in selection.examples:
        splits_of.setdefault(e.gold["source_id"], set()).add(selection.splits[e.id])
    assert all(len(s) == 1 for s in splits_of.values())  # 23 sources have items of two or three classes
    assert Counter(selection.splits.values()) == {"train": 153, "validation": 61, "test": 86}


@pytest.mark.slow
def test_when2call_runs_end_to_end_on_tiny_random(tmp_path):
    result, records = tiny_run(tmp_path, "dataset=when2call", f"dataset.path={TINY}", "llm.batch_size=3")
    assert len(records) == 9 and {r["dataset"] for r in records} == {"when2call"}
    for r in records:  # tiny_random's replies: right iff no call on the asking and declining items
        if r["api"] != "tool_call" and r["pred_api"] is None:
            assert r["label"] == 1
    assert "objective" in result
