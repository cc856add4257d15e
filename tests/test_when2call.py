"""dataset=when2call: When2Call's items, its behaviour labels, splits by source and a run on tiny_random."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
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


def test_an_item_given_twice_is_kept_once_and_counted(tmp_path, caplog):
    lines = TINY.read_text().splitlines()
    twice = tmp_path / "twice.jsonl"
    twice.write_text("\n".join([*lines, lines[0]]) + "\n")
    with caplog.at_level(logging.WARNING):
        dataset, selection = when2call(tmp_path, f"dataset.path={twice}")
    assert len(selection.examples) == 9 and dataset.skipped["a repeat of an earlier item"] == 1
    assert "1 a repeat of an earlier item" in caplog.text


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


# -- the multiple-choice protocol (mice-exp mcq), the reply classes and When2Call's metrics --------------------


def test_the_mcq_prompt_is_when2call_s_default_task(tmp_path):
    dataset, selection = when2call(tmp_path)
    item = next(e for e in selection.examples if e.api == "request_for_info")
    prompt, choices = dataset.multiple_choice(item)
    assert prompt.startswith("You are a helpful AI assistant. \nYou have access to the following tools described in "
                             "<tool></tool>")
    assert prompt.endswith(f"</tool>\n\n{item.query}") and prompt.count("<tool>{") == len(item.tool_names)
    assert list(choices) == ["direct", "tool_call", "request_for_info", "cannot_answer"]
    assert choices["request_for_info"] == item.gold["answers"]["request_for_info"]


def test_a_trailing_space_of_the_context_moves_to_the_answer_as_lm_eval_does(tokenizer):
    from mice_exp.llm.choices import encode_pair

    head, answer = encode_pair(tokenizer, "The capital of France is ", "Paris")
    assert tokenizer.decode(head) == "The capital of France is"
    assert tokenizer.decode(answer) == " Paris" and answer == tokenizer.encode(" Paris")


def slow_logliks(llm, context: str, choices: dict[str, str]) -> dict[str, float]:
    """Each answer scored the slow way: its own full forward over context + answer, no cache, no batch."""
    import torch

    from mice_exp.llm.choices import encode_pair

    out = {}
    for name, text in choices.items():
        head, answer = encode_pair(llm.tokenizer, context, text)
        with torch.inference_mode():
            logits = llm.model(input_ids=torch.tensor([head + answer])).logits[0]
        logp = torch.log_softmax(logits.float(), -1)[len(head) - 1:-1]
        out[name] = float(logp.gather(1, torch.tensor(answer)[:, None]).sum())
    return out


def test_one_prefill_scores_the_four_answers_as_four_separate_forwards_do(tmp_path, tiny_llm):
    import numpy as np

    from mice_exp.llm.choices import score_item
    from mice_exp.metrics.choices import choice_scores

    dataset, selection = when2call(tmp_path)
    for item in {e.api: e for e in selection.examples}.values():  # one item of each class
        prompt, choices = dataset.multiple_choice(item)
        fast, slow = score_item(tiny_llm, prompt, choices, "plain"), slow_logliks(tiny_llm, prompt, choices)
        assert fast["loglik"] == pytest.approx(slow, abs=1e-4)
        for norm in ("sum", "chars"):  # the same answer chosen either way
            lengths = [fast["chars"][n] for n in choices]
            assert (np.argmax(choice_scores([list(fast["loglik"].values())], [lengths], norm))
                    == np.argmax(choice_scores([list(slow.values())], [lengths], norm)))


def test_a_chat_template_is_refused_in_one_line_where_the_tokenizer_has_none():
    from mice_exp.llm.choices import render

    class Plain:
        chat_template = None

    assert render(Plain(), "question", "plain") == "question"
    with pytest.raises(UserError, match="^template=chat: this LLM's tokenizer has no chat template"):
        render(Plain(), "question", "chat")


def test_when2call_s_metrics_on_six_hand_made_items():
    from mice_exp.metrics.choices import (choice_probability, choice_scores, class_f1, hallucination_rate,
                                          macro_f1, margin)

    gold = ["tool_call", "tool_call", "request_for_info", "request_for_info", "cannot_answer", "cannot_answer"]
    pred = ["tool_call", "request_for_info", "request_for_info", "direct", "tool_call", "cannot_answer"]
    # tool_call: TP 1, FP 1, FN 1 -> 2/4; request_for_info: TP 1, FP 1, FN 1 -> 1/2; cannot_answer: TP 1, FN 1 -> 2/3;
    # direct: predicted once, never right -> 0
    assert class_f1(gold, pred) == pytest.approx({"cannot_answer": 2 / 3, "direct": 0.0, "request_for_info": 0.5,
                                                  "tool_call": 0.5})
    assert macro_f1(gold, pred) == pytest.approx((2 / 3 + 0 + 0.5 + 0.5) / 4)
    # the 5th item offers no tool and calls one: 1 of the 1 tool-less cannot_answer items; the 6th offers tools
    assert hallucination_rate(gold, pred, [1, 1, 2, 2, 0, 3]) == 1.0
    assert hallucination_rate(gold, pred, [1, 1, 2, 2, 4, 3]) != hallucination_rate(gold, pred, [1, 1, 2, 2, 0, 3])
    # a long answer loses on its sum and wins per character
    loglik, chars = [[-10.0, -30.0]], [[10, 60]]
    assert choice_scores(loglik, chars, "sum").argmax() == 0 and choice_scores(loglik, chars, "chars").argmax() == 1
    assert choice_probability([[0.0, np.log(3.0)]], 1) == pytest.approx([0.75])
    assert margin([[-1.0, -3.0, -2.0]], 2) == pytest.approx([-1.0]) and margin([[-1.0, -3.0, -2.0]], 0) == [1.0]


@pytest.mark.parametrize(("text", "called", "expected"), [
    ("Action: get_weather\nAction Input: {}", True, "call"),
    ("Could you tell me which city you mean?", False, "ask"),
    ("Please provide the user ID.", False, "ask"),
    ("I'm sorry, I can't help with that. Is there anything else?", False, "decline"),
    ("None of the functions can be used for this.", False, "decline"),
    ("The weather in Paris is sunny.", False, "answer"),
])
def test_a_reply_is_classed_by_rules_a_reader_can_check(text, called, expected):
    from mice_exp.data.when2call import classify_reply

    assert classify_reply(text, called) == expected


def test_an_interrupted_mcq_run_resumes_and_the_command_writes_the_file(tmp_path, monkeypatch, capsys):
    import json

    from conftest import cache_sharing_models
    from mice_exp import commands
    from mice_exp.llm import choices

    cache = cache_sharing_models(tmp_path / "cache")
    argv = ["dataset=when2call", f"dataset.path={TINY}", "llm=tiny_random", "llm.batch_size=4",
            f"paths.cache={cache}", f"output={tmp_path / 'mcq.json'}"]
    commands.mcq(argv)
    first = json.loads((tmp_path / "mcq.json").read_text())
    assert first["template"] == "plain" and len(first["items"]) == 9 and "9 items scored" in capsys.readouterr().out
    assert {i["class"] for i in first["items"]} == {"tool_call", "request_for_info", "cannot_answer"}
    folder = next((cache / "llm").glob("tiny_random-mcq-*"))
    (folder / "shard-00001.jsonl").unlink()  # as if stopped after the first shard

    scored = []
    real = choices.score_item
    monkeypatch.setattr(choices, "score_item", lambda *a: scored.append(a) or real(*a))
    commands.mcq([*argv, "force=true"])
    assert len(scored) == 4  # only the lost shard's items
    assert json.loads((tmp_path / "mcq.json").read_text()) == first
    with pytest.raises(UserError, match="^template='html'; expected one of plain, chat"):
        commands.mcq([*argv, "force=true", "template=html"])
    with pytest.raises(UserError, match="^dataset=ste has no multiple-choice form; expected dataset=when2call"):
        commands.mcq(["dataset=ste", "llm=tiny_random", f"paths.cache={cache}", f"output={tmp_path / 'ste.json'}"])


def test_the_experiment_s_tables_from_six_hand_made_items(tmp_path):
    """experiments/when2call/tables.py on an MCQ file and records written by hand: the numbers follow by hand."""
    import json
    import runpy

    script = runpy.run_path(str(PACKAGE_ROOT / "experiments" / "when2call" / "tables.py"))
    answers = ("direct", "tool_call", "request_for_info", "cannot_answer")
    # per item: (class, split, tools offered, summed log-likelihoods of the four answers); every answer 10 chars
    made = [("tool_call", "test", 1, (-9, -1, -5, -5)), ("tool_call", "train", 2, (-9, -5, -1, -5)),
            ("request_for_info", "test", 1, (-9, -5, -1, -5)), ("request_for_info", "train", 1, (-9, -1, -5, -5)),
            ("cannot_answer", "test", 0, (-9, -1, -5, -5)), ("cannot_answer", "train", 2, (-9, -5, -5, -1))]
    items = [{"id": f"when2call/{c}/{n}", "class": c, "split": split, "n_tools": tools, "conversation": str(n),
              "loglik": dict(zip(answers, ll)), "chars": dict.fromkeys(answers, 10), "tokens": dict.fromkeys(answers, 3),
              "prompt_tokens": 100} for n, (c, split, tools, ll) in enumerate(made)]
    (tmp_path / "mcq.json").write_text(json.dumps({"dataset": "when2call", "llm": "tiny", "display": "Tiny",
                                                   "template": "plain", "method": "m", "items": items}))
    text = script["main"]([str(tmp_path / "mcq.json")])
    # chosen: tool_call, rfi, rfi, tool_call, tool_call, cannot: 3 of 6 right; F1 tool_call 2/5, rfi 1/2, cannot 2/3;
    # the one tool-less cannot_answer item chose tool_call: a hallucination rate of 100%
    assert f"| Tiny (plain) | sum | 6 | 0.500 | {100 * (0.4 + 0.5 + 2 / 3) / 3:.1f} | 100.0 |" in text
    assert "| Tiny (plain) | sum | - | 40.0 | 50.0 | 66.7 |" in text

    # the LLM's own replies: calls on both tool_call items and on the tool-less cannot_answer item
    replies = [("Action: a", "a", 0.9, 0.8), ("Action: a", "a", 0.6, 0.7), ("Which city do you mean?", None, 0.3, 0.5),
               ("It is sunny.", None, 0.4, 0.5), ("Action: b", "b", 0.2, 0.9), ("I cannot do that.", None, 0.5, 0.5)]
    records = {"tiny": [{"id": i["id"], "api": i["class"], "text": text_, "pred_api": api, "raw_confidence": raw,
                         "pred_args": None if api is None else {}, "sources": {"p_true": p_true}}
                        for i, (text_, api, raw, p_true) in zip(items, replies)]}
    assert "| tiny | request_for_info | 2 | 1 | 0 | 1 | 0 |" in script["generation_table"](records)
    runs = [script["load_mcq"](tmp_path / "mcq.json")]
    belief = script["belief_tables"](runs, records)
    # over its 3 calls (2 right): raw confidence ranks them perfectly, P(True) backwards
    assert "| Tiny (plain): raw confidence (its calls) | all | 3 | 0.667 | 1.000 |" in belief
    assert "| Tiny (plain): P(True) (its calls) | all | 3 | 0.667 | 0.000 |" in belief
    # the MCQ prefers asking on the second item, where the LLM called, rightly; raw confidence < 0.5 on the wrong call
    assert "| Tiny (plain) | 6 | 3 | MCQ prefers another answer (chars) | 1 | 0 |" in belief
    assert "| Tiny (plain) | 6 | 3 | raw confidence < 0.5 | 1 | 1 |" in belief
    # the other direction: of its 3 replies without a call, the MCQ prefers calling on the fourth item (a
    # request_for_info item, where asking was right): one reply withheld against its belief, none a right call missed
    assert "| Tiny (plain) | 6 | 3 | MCQ prefers tool_call (chars) | 1 | 0 |" in belief
    assert "| Tiny (plain) | 6 | 3 | MCQ P(tool_call) >= 0.5 | 1 | 0 |" in belief
    # calibrated on the training split, where the one item to call put its likelihood on asking, the fit ranks the
    # test item that prefers asking first: above the test call (which ties with a test item not to call), AUROC 0.25
    assert "| Tiny (plain): MCQ scores, fitted on train | test | 3 | 0.333 | 0.250 |" in belief
    assert "fitted on train | all" not in belief
