"""Judging other agents' calls: actor files read into records, each call rendered canonically and teacher-forced
through a judge LLM after one shared prefill per query (tiny_random weights, the STE fixture's six queries)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mice_exp.compose import compose_config
from mice_exp.errors import UserError
from mice_exp.llm.actors import normalise, read_actor
from mice_exp.llm.judge import judge_actors, publish_judged, resolve_actors
from mice_exp.llm.prompt import PromptBuilder
from mice_exp.llm.records import read_records_file, read_records_header
from mice_exp.llm.sources import call_values, record_prompts
from mice_exp.llm.teacher import score_replies, score_shared
from mice_exp.paths import PACKAGE_ROOT, Paths
from tests.conftest import stage_of
from tests.test_llm_stage import FIXTURE, tiny_cfg
from tests.test_records import published  # noqa: F401 - published: tiny_random's records file

GOLD = {api: [json.loads(r["action_input"]) for r in rows] for api, rows in json.loads(FIXTURE.read_text()).items()}


def reply(api: str, args: dict, layout: str = "indented") -> str:
    text = json.dumps(args, indent=4) if layout == "indented" else json.dumps(args, separators=(",", ":"))
    return (f"Action: <tool_{api}> Action Input: {text}" if layout == "toolken"
            else f"Thought: I will call it.\nAction: {api}\nAction Input: {text}\nObservation")


def actor_file(folder: Path, name: str, replies: dict[str, list[str]], **fields) -> Path:
    """An actor's file in STE's published shape: API -> records in the fixture's order."""
    data = json.loads(FIXTURE.read_text())
    out = {api: [{**row, "model_output": replies[api][i], **fields} for i, row in enumerate(rows)]
           for api, rows in data.items() if api in replies}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(out))
    return path


def right(layout: str = "indented") -> dict[str, list[str]]:
    """Every fixture query answered with its gold call, in ``layout``."""
    return {api: [reply(api, args, layout) for args in rows] for api, rows in GOLD.items()}


def two_actors(folder: Path) -> Path:
    """``first`` answers every fixture query right; ``second`` too but for one wrong ``days`` on add_date's first."""
    actor_file(folder, "first", right())
    wrong = right()
    wrong["add_date"][0] = reply("add_date", {"date": "2022-10-14", "days": 9})
    actor_file(folder, "second", wrong)
    return folder


def judge_stage(cache: Path, llm=None):
    return stage_of(tiny_cfg(), Paths(root=PACKAGE_ROOT, cache=cache), llm)


def fixture_examples(stage) -> dict:
    return {e.id: e for e in stage.dataset.load(stage.paths)}


def test_an_actor_s_replies_are_parsed_labelled_and_what_is_not_judged_is_counted(tmp_path):
    replies = right("toolken")
    replies["add_date"][1] = reply("add_date", {"date": "2022-01-01", "days": 41})  # wrong arguments
    replies["Car database%%Makes"][0] = "I cannot help with that."  # no call
    path = actor_file(tmp_path, "mixed", replies, api_match=1, args_correct=1)
    data = json.loads(path.read_text())
    data["add_date"].append({**data["add_date"][0]})  # a third add_date record: beyond the data set's two
    data["no such API"] = [{**data["add_date"][0]}]
    data["BART%%Advisory information"][1]["query"] = "another question"
    data["BART%%Advisory information"].append("not a record")
    path.write_text(json.dumps(data))
    actor = read_actor(path, fixture_examples(judge_stage(tmp_path)))
    assert normalise("Action: <tool_add_date> Action Input: {}") == "Action: add_date\nAction Input: {}"
    report = actor.report()
    assert (report["records"], report["judged"]) == (9, 4)
    assert {k: report[k] for k in ("unparseable", "unknown_api", "beyond_the_api", "query_differs", "malformed")} == {
        "unparseable": 1, "unknown_api": 1, "beyond_the_api": 1, "query_differs": 1, "malformed": 1}
    assert [(c.id, c.api, c.label) for c in actor.judged()] == [
        ("ste/add_date/0", "add_date", 1), ("ste/add_date/1", "add_date", 0),
        ("ste/Car database%%Makes/1", "Car database%%Makes", 1),
        ("ste/BART%%Advisory information/0", "BART%%Advisory information", 1)]
    # STE called all of them right: it disagrees with the exact-match label on the wrong call and the no-call reply
    assert (report["ste_rated"], report["ours_0_ste_1"], report["ste_agreement"]) == (5, 2, pytest.approx(3 / 5))


@pytest.mark.parametrize("content, problem", [('{"add_date": [{"model_output": "Act', "not readable as JSON"),
                                              ("[1, 2]", "expected an object API -> list of records"),
                                              (b"\x1f\x8b\x08garbage", "not readable as JSON")])
def test_a_broken_actor_file_is_one_line(tmp_path, content, problem):
    path = tmp_path / "broken.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError, match=problem) as info:
        read_actor(path, fixture_examples(judge_stage(tmp_path)))
    assert "\n" not in str(info.value)


def test_an_unknown_actor_name_lists_the_known_ones(tmp_path):
    actor_file(tmp_path / "actors", "known", right())
    with pytest.raises(UserError, match=r"actor='nope': no actor of that name .* expected one of known"):
        resolve_actors(judge_stage(tmp_path), "nope", tmp_path / "actors", tmp_path)


def test_a_call_s_layout_is_not_what_the_judge_scores(tmp_path, tiny_llm):
    """Two actors making the same calls, one indented with toolkens, one compact: one judged record per call."""
    stage = judge_stage(tmp_path / "cache", tiny_llm)
    folder = tmp_path / "actors"
    actor_file(folder, "indented", right("toolken"))
    actor_file(folder, "compact", right("compact"))
    judged = judge_actors(stage, resolve_actors(stage, "indented,compact", folder, tmp_path))
    (_, indented), (header, compact) = judged["indented"], judged["compact"]
    assert indented == compact and len(compact) == 6 and all(r["label"] == 1 for r in compact)
    assert compact[0]["text"] == 'Action: add_date\nAction Input: {"date": "2022-10-14", "days": 90}'
    assert (header["actor"], header["judge"], header["render"]) == ("compact", "tiny_random", "canonical")


def test_k_actors_after_one_prefill_score_as_each_call_alone(tiny_llm, tokenizer):
    prompt = tokenizer.encode("User Query: What is the date 90 days from 2022-10-14?\nAction:")
    calls = [' add_date\nAction Input: {"date": "2022-10-14", "days": 90}', " get_today_date\nAction Input: {}",
             ' add_date\nAction Input: {"date": "2022-10-14", "days": 9}']
    replies = [tokenizer.encode(c, add_special_tokens=False) for c in calls]
    shared = score_shared(tiny_llm, prompt, replies)
    for alone, together in zip(score_replies(tiny_llm, [prompt] * 3, replies), shared):
        np.testing.assert_allclose(together.token_probs, alone.token_probs, atol=1e-6)
        np.testing.assert_allclose(together.states, alone.states, atol=1e-4)
        assert (together.lens_ids == alone.lens_ids).all()


def test_judged_calls_are_kept_and_a_new_actor_scores_only_its_new_calls(tmp_path, tiny_llm, monkeypatch):
    from mice_exp.llm import teacher

    stage = judge_stage(tmp_path / "cache", tiny_llm)
    folder = two_actors(tmp_path / "actors")
    judge_actors(stage, resolve_actors(stage, "first", folder, tmp_path))
    scored = []
    shared = teacher.score_shared
    monkeypatch.setattr(teacher, "score_shared", lambda llm, p, r, **k: scored.append(len(r)) or shared(llm, p, r, **k))
    both = judge_actors(stage, resolve_actors(stage, "first,second", folder, tmp_path))
    assert scored == [1]  # the one call of the second actor that the first did not make
    assert [r["label"] for r in both["second"][1]] == [0, 1, 1, 1, 1, 1]
    assert both["second"][1][1:] == both["first"][1][1:]


def test_an_actor_s_judged_records_are_a_table_1_run_s_records(tmp_path, tiny_llm, capsys):
    from mice_exp.run import run

    stage = judge_stage(tmp_path / "cache", tiny_llm)
    wrong = right()
    wrong["add_date"][0] = reply("add_date", {"date": "2022-10-14", "days": 9})
    wrong["BART%%Advisory information"][1] = reply("BART%%Advisory information", {"cmd": "bsa", "orig": "X"})
    actor_file(tmp_path / "actors", "agent", wrong)
    (path,) = publish_judged(stage, resolve_actors(stage, "agent", tmp_path / "actors", tmp_path), tmp_path / "out")
    assert path.name == "ste-agent-judged-by-tiny_random.jsonl.gz"
    assert read_records_header(path)["actor_report"]["judged"] == 6
    common = ["llm=tiny_random", f"dataset.path={FIXTURE}", "llm.batch_size=2", "llm.max_new_tokens=6",
              "prompt.k_demos=2", "features=conf_only", "estimator=mice_lr", "tracking.enabled=false",
              "permutations=0", "gate.save=false", f"paths.cache={tmp_path / 'cache'}"]
    out = run(compose_config([*common, "actor=agent", f"llm.records={path}"]))
    assert out["llm_examples"] == 6 and np.isfinite(out["objective"])
    with pytest.raises(UserError, match=r"actor=other, but llm.records=.* holds the calls of agent"):
        run(compose_config([*common, "actor=other", f"llm.records={path}"]))
    with pytest.raises(UserError, match=r"actor=agent: a run reads an actor's calls .* expected llm.records="):
        run(compose_config([*common, "actor=agent"]))


def test_a_judged_file_or_another_prompt_s_records_are_refused_as_actors_in_one_line(published, tmp_path, tiny_llm):
    stage = judge_stage(tmp_path / "cache", tiny_llm)
    actor_file(tmp_path / "actors", "agent", right())
    (judged,) = publish_judged(stage, resolve_actors(stage, "agent", tmp_path / "actors", tmp_path), tmp_path)
    with pytest.raises(UserError, match=r"is already a judged records file \(agent judged by tiny_random\)"):
        resolve_actors(stage, str(judged), tmp_path / "actors", tmp_path)
    other = stage_of(tiny_cfg(**{"prompt.k_demos": "3"}), Paths(root=PACKAGE_ROOT, cache=tmp_path))
    with pytest.raises(UserError, match=r"was written with k_demos=2; this run has prompt.k_demos=3"):
        resolve_actors(other, str(published[1]), tmp_path / "actors", tmp_path)
    own = resolve_actors(stage, str(published[1]), tmp_path / "actors", tmp_path)  # the judge's own records
    assert own[0].name == "tiny_random" and len(own[0].calls) == 6
    assert read_records_file(judged, "ste").info["actor"] == "agent"



def test_the_judge_s_p_true_of_a_given_call_is_its_p_true_of_that_call_alone(tmp_path, tiny_llm, monkeypatch):
    """P(True) of another agent's call (the LLM-as-judge baseline) from one prefill per query equals the p_true
    source of that call asked alone; a new actor's run asks only its new calls; a Table-1 run reads it."""
    from mice_exp.llm import judge
    from mice_exp.run import run

    settings = tiny_cfg(**{"sources.use": "[p_true]"})["sources"]
    stage = judge_stage(tmp_path / "cache", tiny_llm)
    folder = two_actors(tmp_path / "actors")
    judge_actors(stage, resolve_actors(stage, "first", folder, tmp_path), settings)
    asked = []
    given = judge.given_call_values
    monkeypatch.setattr(judge, "given_call_values", lambda *a: asked.append(len(a[3])) or given(*a))
    header, records = judge_actors(stage, resolve_actors(stage, "first,second", folder, tmp_path), settings)["second"]
    assert asked == [1] and header["sources"] == ["p_true"]  # the second actor's one new call
    fresh = judge_stage(tmp_path / "fresh", tiny_llm)
    together = judge_actors(fresh, resolve_actors(fresh, "first,second", folder, tmp_path), settings)["second"][1]
    assert sorted(asked[1:]) == [1] * 5 + [2]  # add_date's first query: both actors' calls after one prefill
    np.testing.assert_allclose([r["sources"]["p_true"] for r in together], [r["sources"]["p_true"] for r in records],
                               atol=1e-5)
    builder = PromptBuilder.from_config(stage.prompt, tiny_llm.tokenizer)
    demos = stage.demos(tmp_path / "demos")
    for record in records:
        prompts = record_prompts(builder, fixture_examples(stage), demos, record)
        alone = call_values(stage.backend.source_runner(), settings, stage.llm, prompts, ["p_true"])["p_true"]
        assert abs(record["sources"]["p_true"] - alone) < 1e-5
    (path,) = publish_judged(stage, resolve_actors(stage, "second", folder, tmp_path), tmp_path / "out", settings)
    out = run(compose_config(["llm=tiny_random", f"dataset.path={FIXTURE}", "llm.batch_size=2",
                              "llm.max_new_tokens=6", "prompt.k_demos=2", "estimator=p_true", "tracking.enabled=false",
                              "permutations=0", "gate.save=false", f"paths.cache={tmp_path / 'cache'}",
                              "actor=second", f"llm.records={path}"]))
    assert out["llm_examples"] == 6 and np.isfinite(out["objective"])


def test_a_source_about_the_judge_s_own_generations_is_refused_for_judged_calls_in_one_line(tmp_path):
    stage = judge_stage(tmp_path / "cache")
    actor_file(tmp_path / "actors", "agent", right())
    with pytest.raises(UserError, match=r"sources.use lists \['consistency'\] for judged calls; expected some of "
                                        r"p_true, verbalized"):
        judge_actors(stage, resolve_actors(stage, "agent", tmp_path / "actors", tmp_path),
                     tiny_cfg(**{"sources.use": "[consistency]"})["sources"])


def test_published_judged_records_stand_in_for_their_calls_when_a_source_is_asked_later(tmp_path, tiny_llm,
                                                                                        monkeypatch):
    """On another machine (no judge cache), asking P(True) of published judged calls judges none of them again,
    and the republished records are the published ones with the source beside them."""
    from mice_exp.llm import teacher

    folder = tmp_path / "actors"
    actor_file(folder, "agent", right())
    stage = judge_stage(tmp_path / "cache", tiny_llm)
    (path,) = publish_judged(stage, resolve_actors(stage, "agent", folder, tmp_path), tmp_path / "out")
    before = read_records_file(path, "ste")
    elsewhere = judge_stage(tmp_path / "elsewhere", tiny_llm)
    monkeypatch.setattr(teacher, "score_shared", lambda *a, **k: pytest.fail("a published call judged again"))
    publish_judged(elsewhere, resolve_actors(elsewhere, "agent", folder, tmp_path), tmp_path / "out",
                   tiny_cfg(**{"sources.use": "[p_true]"})["sources"])
    after = read_records_file(path, "ste")
    assert after.records == [r | {"sources": {"p_true": p}} for r, p in zip(before.records, after.sources["p_true"])]
    assert after.key == before.key and all(0 < p < 1 for p in after.sources["p_true"])
