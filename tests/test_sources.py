"""Confidence sources beyond raw probability: P(True), verbalized, self-consistency (on tiny_random)."""

from __future__ import annotations

import numpy as np
import pytest

import mice_exp.llm.sources as sources
from mice_exp.llm.sources import compute_source, load_source, option_token_ids, parse_percent
from mice_exp.llm.records import read_stage
from mice_exp.data import select_examples
from mice_exp.llm.stage import run_llm_stage
from tests.test_llm_stage import paths_in, tiny_cfg


@pytest.mark.parametrize("text,expected", [("85", 0.85), ("I'd say 40%.", 0.4), ("100", 1.0), ("0", 0.0),
                                           ("120", None), ("very sure", None), ("", None)])
def test_verbalized_answers_are_parsed_or_missing(text, expected):
    assert parse_percent(text) == expected


def test_option_tokens_cover_the_letter_with_and_without_a_space(tokenizer):
    ids = option_token_ids(tokenizer, "A")
    assert tokenizer.decode(ids[0]).strip() == "A" and len(ids) == 2


@pytest.fixture(scope="module")
def stage(tmp_path_factory, tiny_llm):
    tmp = tmp_path_factory.mktemp("sources")
    cfg = tiny_cfg()
    out = run_llm_stage(cfg, paths_in(tmp), llm=tiny_llm)
    examples = {e.id: e for e in select_examples(cfg["dataset"], paths_in(tmp)).examples}
    return cfg, out, examples, read_stage(out).records


@pytest.mark.parametrize("name", ["p_true", "verbalized", "consistency"])
def test_each_source_gives_a_value_or_missing_per_record_and_is_cached(stage, tiny_llm, monkeypatch, name):
    cfg, out, examples, records = stage
    cfg["sources"]["consistency"]["samples"] = 3
    folder = compute_source(name, cfg, out, examples, records, tiny_llm)
    values = load_source(folder, [r["id"] for r in records])
    assert values.shape == (len(records),)
    finite = values[~np.isnan(values)]
    assert ((finite >= 0) & (finite <= 1)).all()
    if name == "p_true":
        assert np.isfinite(values).all()
    monkeypatch.setattr(sources, "p_true", lambda *a, **k: pytest.fail("recomputed"))
    monkeypatch.setattr(sources, "verbalized", lambda *a, **k: pytest.fail("recomputed"))
    monkeypatch.setattr(sources, "consistency", lambda *a, **k: pytest.fail("recomputed"))
    assert compute_source(name, cfg, out, examples, records, tiny_llm) == folder


def test_consistency_counts_samples_equal_to_the_greedy_call(tiny_llm, tokenizer, monkeypatch):
    greedy = [{"pred_api": "f", "pred_args": {"a": 1}, "parse_error": None},
              {"pred_api": None, "pred_args": None, "parse_error": "no 'Action:' line"}]
    texts = ['Action: f\nAction Input: {"a": 1}', 'Action: f\nAction Input: {"a": 2}', 'Action: f\nAction Input: {"a":1}',
             'Action: f\nAction Input: {"a": 1}', "nothing", "nothing"]
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, rows))
    padded = [r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows]
    import torch

    batches = iter([padded[:3], padded[3:]])
    monkeypatch.setattr(sources, "sample_ids", lambda *a, **k: torch.tensor(next(batches)))
    values = sources.consistency(tiny_llm, [[1], [1]], greedy, samples=3, temperature=1.0, max_new_tokens=4, seed=0)
    assert values == [pytest.approx(2 / 3), 0.0]


def test_samples_share_one_prefill_and_match_plain_generation(tiny_llm):
    """Greedy continuations from the repeated prefix cache equal generate's from the full prompt."""
    from mice_exp.llm.capture import generate_ids, sample_ids

    prompt = list(range(5, 40))
    plain = generate_ids(tiny_llm, [prompt], max_new_tokens=6)
    shared = sample_ids(tiny_llm, prompt, samples=3, max_new_tokens=6)
    assert shared.shape[0] == 3
    assert all(row.tolist() == plain[0].tolist() for row in shared)
