"""Confidence sources beyond raw probability: P(True), verbalized, self-consistency, the way out (on tiny_random)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import mice_exp.llm.prefix_sources as prefix_sources
from mice_exp.cache import read_json, stable_hash
from mice_exp.errors import UserError
from mice_exp.llm.capture import generate_ids
from mice_exp.llm.prompt import PromptBuilder
from mice_exp.llm.settings import LLMSettings, PromptSettings
from mice_exp.llm.records import read_records_file, read_stage
from mice_exp.llm.prefix_sources import PrefixSources, prefill, shared_length
from mice_exp.llm.prompt import option_token_ids
from mice_exp.llm.sources import (Prompts, agreement, compute_sources, load_source, parse_percent, semantic_confidence,
                                  stage_sources)
from mice_exp.pipeline import Pipeline
from mice_exp.llm.toolcall import parse_call
from tests.test_llm_stage import paths_in, tiny_cfg


@pytest.mark.parametrize("text,expected", [("85", 0.85), ("I'd say 40%.", 0.4), ("100", 1.0), ("0", 0.0),
                                           ("120", None), ("very sure", None), ("", None)])
def test_verbalized_answers_are_parsed_or_missing(text, expected):
    assert parse_percent(text) == expected


def test_option_tokens_cover_the_letter_with_and_without_a_space(tokenizer):
    ids = option_token_ids(tokenizer, "A")
    assert tokenizer.decode(ids[0]).strip() == "A" and len(ids) == 2


def test_consistency_counts_samples_equal_to_the_greedy_call():
    greedy = {"pred_api": "f", "pred_args": {"a": 1}, "parse_error": None}
    samples = [parse_call(t) for t in ['Action: f\nAction Input: {"a": 1}', 'Action: f\nAction Input: {"a": 2}',
                                       'Action: f\nAction Input: {"a":1}']]
    assert agreement(samples, greedy) == pytest.approx(2 / 3)
    assert agreement(samples, {"pred_api": None, "pred_args": None, "parse_error": "no 'Action:' line"}) == 0.0


def test_semantic_entropy_clusters_equal_calls_and_keeps_unparseable_samples_apart():
    same, other = 'Action: f\nAction Input: {"a": 1}', 'Action: f\nAction Input: {"a": 2}'
    garbage = "I am not sure what to call."
    assert semantic_confidence([parse_call(t) for t in [same, same, 'Action: f\nAction Input: {"a":1}']]) == 1.0
    assert semantic_confidence([parse_call(t) for t in [same, other, garbage]]) == pytest.approx(0.0)
    assert semantic_confidence([parse_call(t) for t in [garbage, garbage]]) == pytest.approx(0.0)  # never one cluster
    two_one = -(2 / 3 * np.log(2 / 3) + 1 / 3 * np.log(1 / 3)) / np.log(3)
    assert semantic_confidence([parse_call(t) for t in [same, other, same]]) == pytest.approx(1 - two_one)


def test_self_consistency_samples_stop_a_margin_after_the_greedy_call():
    from mice_exp.llm.sources import sample_budget

    record = {"token_ids": list(range(20))}
    llm = LLMSettings.from_config(tiny_cfg(**{"llm.max_new_tokens": "96"})["llm"])
    assert sample_budget(record, {"extra_tokens": 16}, llm) == 36
    assert sample_budget(record, {"extra_tokens": 100}, llm) == 96
    assert sample_budget(record, {"extra_tokens": None}, llm) == 96


@pytest.fixture(scope="module")
def stage(tmp_path_factory, tiny_llm):
    tmp = tmp_path_factory.mktemp("sources")
    cfg = tiny_cfg()
    cfg["sources"]["consistency"]["samples"] = 3
    llm_stage = Pipeline.from_config(cfg, paths_in(tmp), tiny_llm).stage
    out = llm_stage.run()
    examples = {e.id: e for e in llm_stage.selection.examples}
    return SimpleNamespace(cfg=cfg, out=out, examples=examples, demos=read_json(out / "demos.json"),
                           records=read_stage(out).records, paths=paths_in(tmp), of=llm_stage)


def prompts_of(stage, llm, record):
    demos = [stage.examples[d] for d in stage.demos[record["id"]][:record["n_demos"]]]
    return Prompts(PromptBuilder.from_config(PromptSettings.from_config(stage.cfg["prompt"]), llm.tokenizer), stage.examples[record["id"]], demos,
                   record)


def test_every_source_is_computed_once_per_record_and_cached(stage, tiny_llm, monkeypatch):
    names = ["p_true", "verbalized", "consistency", "semantic_entropy", "acts"]
    folders = compute_sources(names, stage.cfg["sources"], stage.of, stage.out, stage.examples, stage.demos,
                              stage.records, PrefixSources(tiny_llm))
    ids = [r["id"] for r in stage.records]
    for name in names:
        values = load_source(folders[name], ids)
        finite = values[~np.isnan(values)]
        assert values.shape == (len(ids),) and ((finite >= 0) & (finite <= 1)).all()
    assert np.isfinite(load_source(folders["p_true"], ids)).all()
    assert set(load_source(folders["acts"], ids)) <= {0.0, 1.0}
    monkeypatch.setattr(prefix_sources, "PrefixCall", lambda *a, **k: pytest.fail("recomputed"))
    assert compute_sources(names, stage.cfg["sources"], stage.of, stage.out, stage.examples, stage.demos,
                           stage.records, PrefixSources(tiny_llm)) == folders


def test_consistency_only_on_the_splits_it_is_asked_for(stage, tiny_llm):
    settings = {**stage.cfg["sources"], "consistency": {**stage.cfg["sources"]["consistency"], "splits": ["test"]}}
    folder = compute_sources(["consistency"], settings, stage.of, stage.out, stage.examples, stage.demos,
                             stage.records, PrefixSources(tiny_llm))["consistency"]
    values = load_source(folder, [r["id"] for r in stage.records])
    is_test = np.array([r["split"] == "test" for r in stage.records])
    assert is_test.any() and np.isfinite(values[is_test]).all() and np.isnan(values[~is_test]).all()


def test_semantic_entropy_alone_later_reads_the_samples_consistency_read(stage, tiny_llm, tmp_path):
    """Both sampled sources come from one seeded set of samples per batch, so computing semantic entropy
    after self-consistency (another call, another cache folder) gives what computing both at once gives."""
    ids = [r["id"] for r in stage.records]
    together = compute_sources(["consistency", "semantic_entropy"], stage.cfg["sources"], stage.of, tmp_path / "both",
                               stage.examples, stage.demos, stage.records, PrefixSources(tiny_llm))
    alone = compute_sources(["semantic_entropy"], stage.cfg["sources"], stage.of, tmp_path / "alone", stage.examples,
                            stage.demos, stage.records, PrefixSources(tiny_llm))
    np.testing.assert_array_equal(load_source(alone["semantic_entropy"], ids),
                                  load_source(together["semantic_entropy"], ids))
    assert together["semantic_entropy"].name != together["consistency"].name


def test_the_way_out_follows_the_query_so_every_variant_shares_the_prompt_up_to_it(stage, tiny_llm):
    record = stage.records[0]
    prompts = prompts_of(stage, tiny_llm, record)
    note = stage.cfg["sources"]["acts"]["instruction"]
    way_out = prompts.with_note(note)
    assert tiny_llm.tokenizer.decode(way_out).count("Action: ask_user") == 1
    variants = [prompts.original, way_out, prompts.followup("Is it correct?")]
    start = shared_length(variants)
    query_end = len(tiny_llm.tokenizer.decode(prompts.original[:start]))
    assert stage.examples[record["id"]].query in tiny_llm.tokenizer.decode(prompts.original[:start])
    assert start > 0.9 * len(prompts.original) and query_end > 0


def test_continuing_a_shared_prefix_gives_what_the_whole_prompt_gives(stage, tiny_llm):
    """P(True) and greedy generation from a copy of the prefix cache equal those of the full prompt."""
    prompts = prompts_of(stage, tiny_llm, stage.records[0])
    full = prompts.followup(stage.cfg["sources"]["p_true"]["question"])
    start = shared_length([prompts.original, full])
    shared = prefix_sources.p_true(tiny_llm, prefill(tiny_llm, full[:start]), start, full)
    whole = prefix_sources.p_true(tiny_llm, prefill(tiny_llm, []), 0, full)
    assert shared == pytest.approx(whole, abs=1e-5)
    plain = generate_ids(tiny_llm, [full], max_new_tokens=6)
    continued = generate_ids(tiny_llm, [full], max_new_tokens=6, cache=prefill(tiny_llm, full[:start]))
    assert continued[0].tolist() == plain[0].tolist()


def test_samples_share_one_prefill_and_match_plain_generation(tiny_llm):
    """Greedy continuations from the repeated prefix cache equal generate's from the full prompt."""
    prompt = list(range(5, 40))
    plain = generate_ids(tiny_llm, [prompt], max_new_tokens=6)
    cache = prefill(tiny_llm, prompt[:-1])
    cache.batch_repeat_interleave(3)
    shared = generate_ids(tiny_llm, [prompt] * 3, max_new_tokens=6, cache=cache)
    assert all(row.tolist() == plain[0].tolist() for row in shared)


def test_a_records_file_gets_its_sources_without_its_llm_stage(stage, tiny_llm, tmp_path):
    """``mice-exp records llm.records=FILE sources.use=[...]``: demonstrations retrieved again, prompts
    checked against the records' hashes, values equal to those computed beside the stage."""
    from mice_exp.llm.publish import publish_records

    pipeline = Pipeline.from_config(stage.cfg, stage.paths, tiny_llm)
    plain = publish_records(pipeline.stage, pipeline.sources, tmp_path / "plain.jsonl.gz")
    cfg = {**stage.cfg, "llm": {**stage.cfg["llm"], "records": str(plain)},
           "sources": {**stage.cfg["sources"], "use": ["p_true"]}}
    pipeline = Pipeline.from_config(cfg, stage.paths, tiny_llm)  # its stage: the records file
    with_p_true = publish_records(pipeline.stage, pipeline.sources, tmp_path / "with.jsonl.gz")
    from_file = read_records_file(with_p_true).sources["p_true"]
    assert read_records_file(with_p_true).key == read_records_file(plain).key  # its BERTScore cache still serves
    beside = compute_sources(["p_true"], stage.cfg["sources"], stage.of, stage.out, stage.examples, stage.demos,
                             stage.records, PrefixSources(tiny_llm))
    assert from_file == pytest.approx(list(load_source(beside["p_true"], [r["id"] for r in stage.records])))

    swapped = read_records_file(plain)  # a near-tie in retrieval ordered the other way on the CPU that wrote them
    record = swapped.records[0]
    order = [stage.examples[d] for d in stage.demos[record["id"]][:record["n_demos"]]]
    assert len(order) == 2
    builder = PromptBuilder.from_config(PromptSettings.from_config(cfg["prompt"]), tiny_llm.tokenizer)
    record["prompt_hash"] = stable_hash(Prompts(builder, stage.examples[record["id"]], order[::-1], {}).original)
    assert Prompts(builder, stage.examples[record["id"]], order, record).demos == order[::-1]

    tampered = read_records_file(plain)
    tampered.records[0]["prompt_hash"] = "0" * 16
    with pytest.raises(UserError, match="prompt rebuilt here differs"):
        stage_sources(pipeline.sources, pipeline.stage, tampered, ["verbalized"])
