"""Judging another LLM's calls: an actor's records file replayed through a judge LLM (tiny_random weights)."""

from __future__ import annotations

import numpy as np
import pytest

from mice_exp.compose import compose_config
from mice_exp.errors import UserError
from mice_exp.llm.records import read_records_file, read_records_header, write_records_file
from mice_exp.paths import PACKAGE_ROOT, Paths
from tests.conftest import stage_of
from tests.test_llm_stage import FIXTURE, tiny_cfg
from tests.test_records import published  # noqa: F401 - published: tiny_random's records file, the actor's


def judge(cache, name: str, seed: int = 0, llm=None):
    """The stage of a judge LLM named ``name``: tiny_random's architecture with the weights of ``seed``."""
    return stage_of(tiny_cfg(**{"llm.name": name, "llm.source.seed": str(seed)}), Paths(root=PACKAGE_ROOT, cache=cache),
                    llm)


def judged(stage, actor, tmp_path):
    from mice_exp.llm.replay import judge_records

    header, records = judge_records(stage, actor)
    path = tmp_path / f"judged-by-{stage.llm['name']}.jsonl.gz"
    write_records_file(path, header, records)
    return path


def test_a_judge_with_the_actor_s_weights_gives_back_the_actor_s_own_records(published, tiny_llm, tmp_path):
    """Teacher-forcing a call through the LLM that generated it is what generating it captured."""
    actor = read_records_file(published[1])
    twin = judged(judge(tmp_path / "cache", "tiny_twin", llm=tiny_llm), published[1], tmp_path)
    header, mine = read_records_header(twin), read_records_file(twin, "ste")
    assert (header["llm"], header["actor"], header["judge"]) == ("tiny_twin", "tiny_random", "tiny_twin")
    assert header["display"] == "tiny-random-Llama judged by tiny-random-Llama" and header["examples"] == 6
    assert mine.ids == actor.ids and mine.n_layers == actor.n_layers
    for theirs, ours in zip(actor.records, mine.records):
        for key in ("text", "token_ids", "offsets", "content_mask", "label", "pred_api", "parse_error", "split",
                    "prompt_hash", "layer_strings"):
            assert ours[key] == theirs[key], key
        np.testing.assert_allclose(ours["token_probs"], theirs["token_probs"], rtol=1e-4)
        assert ours["raw_confidence"] == pytest.approx(theirs["raw_confidence"], rel=1e-4)


def test_another_llm_judges_the_same_calls_with_its_own_confidence(published, tmp_path, monkeypatch):
    actor = read_records_file(published[1])
    stage = judge(tmp_path / "cache", "tiny_other", seed=1)
    path = judged(stage, published[1], tmp_path)
    other = read_records_file(path, "ste", expect=stage.made_with())  # what a run reading it checks
    assert [r["label"] for r in other.records] == [r["label"] for r in actor.records]
    assert [r["text"] for r in other.records] == [r["text"] for r in actor.records]
    assert all(r["token_ids"] == a["token_ids"] for r, a in zip(other.records, actor.records))  # one tokenizer
    ours, theirs = ([r["raw_confidence"] for r in records.records] for records in (other, actor))
    assert not np.allclose(ours, theirs, rtol=1e-2, atol=0)  # another model's probabilities of the same tokens
    assert all(len(r["layer_strings"]) == other.n_layers - 1 for r in other.records)
    from mice_exp.llm import model

    monkeypatch.setattr(model, "load_hf", lambda *a: pytest.fail("the judged calls are cached"))
    again = judged(judge(tmp_path / "cache", "tiny_other", seed=1), published[1], tmp_path / "again")
    assert read_records_file(again).records == other.records


def test_table1_runs_on_a_judged_records_file(published, tmp_path):
    from mice_exp.run import run

    path = judged(judge(tmp_path / "cache", "tiny_other", seed=1), published[1], tmp_path)
    out = run(compose_config(["llm=tiny_random", "llm.name=tiny_other", "llm.source.seed=1", f"llm.records={path}",
                              "features=conf_only", "estimator=mice_lr", "tracking.enabled=false", "permutations=0",
                              "gate.save=false", f"paths.cache={tmp_path}", f"dataset.path={FIXTURE}",
                              "llm.batch_size=2", "llm.max_new_tokens=6", "prompt.k_demos=2"]))
    assert out["llm_examples"] == 6 and np.isfinite(out["objective"])


def test_a_judge_refuses_its_own_records_and_judged_ones_in_one_line(published, tiny_llm, tmp_path):
    from mice_exp.llm.replay import judge_records

    with pytest.raises(UserError, match=r"was written by tiny_random itself; a judge replays another LLM's") as info:
        judge_records(judge(tmp_path / "cache", "tiny_random", llm=tiny_llm), published[1])
    assert "\n" not in str(info.value)
    path = judged(judge(tmp_path / "cache", "tiny_twin", llm=tiny_llm), published[1], tmp_path)
    with pytest.raises(UserError, match=r"is already a judged records file \(tiny_random judged by tiny_twin\)"):
        judge_records(judge(tmp_path / "cache", "tiny_third", llm=tiny_llm), path)
    with pytest.raises(UserError, match=r"was written with k_demos=2; this run has prompt.k_demos=3"):
        judge_records(stage_of(tiny_cfg(**{"llm.name": "tiny_third", "prompt.k_demos": "3"}),
                               Paths(root=PACKAGE_ROOT, cache=tmp_path)), published[1])
