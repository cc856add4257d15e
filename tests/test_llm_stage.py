"""The LLM stage on tiny_random: records, resume after an interruption, cache reuse."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mice_exp.llm.runner as runner
from mice_exp.compose import as_plain, compose_config
from mice_exp.llm.records import read_stage
from mice_exp.paths import PACKAGE_ROOT, Paths
from tests.conftest import stage_of

FIXTURE = PACKAGE_ROOT / "tests" / "fixtures" / "ste_tiny.json"


def tiny_cfg(**extra: str) -> dict:
    overrides = ["llm=tiny_random", f"dataset.path={FIXTURE}", "llm.batch_size=2", "llm.max_new_tokens=6",
                 "prompt.k_demos=2"] + [f"{k}={v}" for k, v in extra.items()]
    return as_plain(compose_config(overrides))


def paths_in(tmp: Path) -> Paths:
    return Paths(root=PACKAGE_ROOT, cache=tmp)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_llm):
    tmp = tmp_path_factory.mktemp("full")
    return stage_of(tiny_cfg(), paths_in(tmp), tiny_llm).run()


def test_every_example_gets_a_record_with_layer_strings(finished, tiny_llm):
    records = read_stage(finished).records
    assert len(records) == 6
    for r in records:
        assert len(r["layer_strings"]) == tiny_llm.n_layers - 1
        assert len(r["token_probs"]) == len(r["token_ids"]) == len(r["content_mask"])
        assert 0.0 <= r["raw_confidence"] <= 1.0
        assert r["label"] in (0, 1)
    assert read_stage(finished).arrays("mean_pool").shape == (6, tiny_llm.n_layers, tiny_llm.hidden_size)


def test_a_killed_run_resumes_to_identical_records(finished, tmp_path, tiny_llm, monkeypatch):
    calls = {"n": 0}
    real = runner.generate_batch

    def dies_on_second_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "generate_batch", dies_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        stage_of(tiny_cfg(), paths_in(tmp_path), tiny_llm).run()
    partial = next((tmp_path / "llm").iterdir())
    assert len(list(partial.glob("shard-*.jsonl"))) == 1 and not (partial / "done.json").exists()
    monkeypatch.setattr(runner, "generate_batch", real)
    resumed = stage_of(tiny_cfg(), paths_in(tmp_path), tiny_llm).run()
    assert resumed.name == finished.name  # same key
    assert read_stage(resumed).records == read_stage(finished).records
    for name in ("mean_pool", "last_token", "first_token"):
        np.testing.assert_array_equal(read_stage(resumed).arrays(name), read_stage(finished).arrays(name))


def test_a_finished_stage_is_reused_not_recomputed(finished, tiny_llm, monkeypatch):
    monkeypatch.setattr(runner, "generate_batch", lambda *a, **k: pytest.fail("generated again"))
    cache = finished.parent.parent
    assert stage_of(tiny_cfg(), paths_in(cache), tiny_llm).run() == finished


def test_estimator_settings_do_not_change_the_key(finished):
    cache = finished.parent.parent
    assert stage_of(tiny_cfg(**{"estimator": "hre", "risk": "high"}), paths_in(cache)).folder()[0] == finished
    assert stage_of(tiny_cfg(**{"prompt.k_demos": 1}), paths_in(cache)).folder()[0] != finished




def test_max_per_api_changes_the_key_only_when_set(finished):
    """Caches written before ``dataset.max_per_api`` existed keep their key while it is null."""
    cfg = tiny_cfg()
    without = {**cfg, "dataset": {k: v for k, v in cfg["dataset"].items() if k != "max_per_api"}}
    limited = {**cfg, "dataset": {**cfg["dataset"], "max_per_api": 2}}
    paths = paths_in(finished.parent.parent)
    selection = stage_of(cfg, paths).selection
    key = {name: stage_of(c, paths, selection=selection).key("cpu") for name, c in
           (("set", cfg), ("without", without), ("limited", limited))}
    assert key["set"] == key["without"] != key["limited"]
