"""dataset=bfcl_multi_turn: BFCL v4 multi-turn per step, the history executed in bfcl-eval's backends, labelled by
its state and response checks, and a run on tiny_random."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from conftest import tiny_run
from mice_exp.compose import as_plain, compose_config
from mice_exp.data import make_dataset
from mice_exp.data.bfcl_multi_turn import checker_agreement
from mice_exp.data.labels import call_expected, gold_api, is_correct
from mice_exp.errors import UserError
from mice_exp.llm.prompt import PromptBuilder
from mice_exp.llm.settings import PromptSettings
from mice_exp.paths import PACKAGE_ROOT, Paths
from mice_exp.tracking.schema import trajectory_key


def steps(tmp_path: Path, *overrides: str):
    cfg = as_plain(compose_config(["dataset=bfcl_multi_turn", "dataset.max_conversations=2", *overrides]))
    dataset = make_dataset(cfg["dataset"])
    return dataset, dataset.select(Paths(root=PACKAGE_ROOT, cache=tmp_path))


def test_each_gold_call_is_a_step_after_the_executed_gold_history(tmp_path):
    dataset, selection = steps(tmp_path)
    first = [e for e in selection.examples if e.gold["entry"]["id"] == "multi_turn_base_0"]
    # BFCL's multi_turn_base_0: 4 turns, gold calls 3 + 2 + 1 + 4
    assert [e.id.rsplit("/", 2)[1:] for e in first][:4] == [["0", "0"], ["0", "1"], ["0", "2"], ["1", "0"]]
    assert [e.gold["call"] for e in first[:3]] == [("cd", {"folder": "document"}), ("mkdir", {"dir_name": "temp"}),
                                                  ("mv", {"source": "final_report.pdf", "destination": "temp"})]
    assert first[5].gold["call"] == ("sort", {"file_name": "final_report.pdf"})  # sort('final_report.pdf'), named
    turns = first[3].conversation.turns  # turn 1, step 0: turn 0's user text, its three calls and their results
    assert [t.role for t in turns] == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "user"]
    assert turns[-2].text == '{"result": "\'final_report.pdf\' moved to \'temp/final_report.pdf\'"}'
    assert first[3].query == turns[-1].text and first[3].query.startswith("Perform a detailed search using grep")
    assert {selection.splits[e.id] for e in first} == {selection.splits[first[0].id]}  # one conversation, one split
    assert not dataset.skipped


def test_a_step_is_right_iff_bfcl_s_state_and_response_checks_pass(tmp_path):
    _, selection = steps(tmp_path)
    step = next(e for e in selection.examples if e.gold["call"] == ("mkdir", {"dir_name": "temp"}))
    assert is_correct(step, "mkdir", {"dir_name": "temp"}) and gold_api(step) == "mkdir"
    assert not is_correct(step, "mkdir", {"dir_name": "tmp"})  # another state
    assert not is_correct(step, "ls", {})  # same state, another response
    assert not is_correct(step, "mkdir", {"nope": 1}) and not is_correct(step, None, None)
    assert not is_correct(step, "no_such_function", {})


def test_a_missing_function_s_turn_is_a_step_where_no_call_is_right(tmp_path):
    _, selection = steps(tmp_path, "dataset.categories=[multi_turn_miss_func]", "dataset.max_conversations=1")
    empty = [e for e in selection.examples if e.gold["call"] is None]
    assert len(empty) == 1 and call_expected(empty[0]) is False
    assert is_correct(empty[0], None, None) and not is_correct(empty[0], "sort", {"file_name": "final_report.pdf"})
    held = "sort"  # missed_function {"3": ["sort"]}: offered from turn 3 on
    assert held not in empty[0].tool_names
    after = [e for e in selection.examples if e.id.split("/")[-2] == "3"]
    assert after and held in after[0].tool_names and after[0].query.startswith("I have updated some more functions")


def test_the_prompt_shows_the_history_in_the_reply_format(tmp_path, tokenizer):
    _, selection = steps(tmp_path)
    step = next(e for e in selection.examples if e.id.endswith("/0/1/0"))
    cfg = as_plain(compose_config(["llm=tiny_random"]))["prompt"]
    messages = PromptBuilder.from_config(PromptSettings.from_config(cfg), tokenizer).messages(step, [])
    # turn 0's query, then each of its three calls with its result (in a user turn), then turn 1's query
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert messages[2]["content"].startswith("Action: cd\nAction Input: ") and messages[3]["content"].startswith(
        "Observation: ")
    assert messages[-1]["content"].startswith("Observation: ") and messages[-1]["content"].endswith(step.query)


def test_categories_are_checked_before_anything_loads():
    with pytest.raises(UserError, match=r"^dataset\.categories=\['multi_turn'\]: expected a non-empty list of "):
        make_dataset(as_plain(compose_config(["dataset=bfcl_multi_turn", "dataset.categories=[multi_turn]"]))["dataset"])


@pytest.mark.slow
def test_bfcl_multi_turn_runs_end_to_end_on_tiny_random(tmp_path):
    result, records = tiny_run(tmp_path, "dataset=bfcl_multi_turn", "dataset.max_conversations=2")
    assert Counter(r["dataset"] for r in records) == {"bfcl_multi_turn": len(records)} and len(records) >= 10
    assert "objective" in result
    # whole conversations scored too: each record names its conversation, the run logs trajectory scores
    assert all(r["conversation"] == r["id"].rsplit("/", 2)[0] for r in records)
    assert result[trajectory_key("", "n")] >= 1 and trajectory_key("raw", "product_brier") in result


def test_a_conversation_whose_gold_cannot_be_replayed_is_skipped_and_counted(tmp_path, monkeypatch, caplog):
    from mice_exp.data import bfcl_multi_turn

    read = bfcl_multi_turn._read

    def broken(path: Path) -> list[dict]:
        rows = read(path)[:2]
        if "possible_answer" in str(path):  # the first conversation's second gold call names no backend function
            rows[0] = {**rows[0], "ground_truth": [["cd(folder='document')", "teleport(to='temp')"],
                                                   *rows[0]["ground_truth"][1:]]}
        return rows

    monkeypatch.setattr(bfcl_multi_turn, "_read", broken)
    with caplog.at_level("WARNING"):
        dataset, selection = steps(tmp_path)
    assert dataset.skipped == {"conversations with a gold call naming no function of its classes": 1}
    assert {e.gold["entry"]["id"] for e in selection.examples} == {"multi_turn_base_1"}
    assert "1 items skipped" in caplog.text


def test_bfcl_s_own_checker_agrees_with_the_step_labels_on_gold_and_on_a_wrong_call(tmp_path):
    _, selection = steps(tmp_path, "dataset.max_conversations=1")
    first = [e for e in selection.examples if e.gold["call"] is not None]
    gold = {e.id: e.gold["call"] for e in first}
    by_step, by_conversation = checker_agreement(first, gold)
    assert all(by_step.values()) and by_conversation == {"multi_turn_base_0": True}
    mkdir = next(e for e in first if e.gold["call"] == ("mkdir", {"dir_name": "temp"}))
    for wrong in [("mkdir", {"dir_name": "tmp"}), None, ("__import__('os').getcwd", {})]:
        by_step, by_conversation = checker_agreement(first, {**gold, mkdir.id: wrong})
        assert not by_step[mkdir.id] and not is_correct(mkdir, *(wrong or (None, None)))
        assert sum(by_step.values()) == len(first) - 1 and by_conversation == {"multi_turn_base_0": False}
