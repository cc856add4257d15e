"""A damaged cache file (a crash, a full disk, a copy cut short) is named in one warning, set aside
as ``*.damaged`` and only what it held is recomputed: the records end identical to an intact run's."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import mice_exp.llm.runner as runner
from conftest import cache_sharing_models, stage_of
from mice_exp.compose import as_plain, compose_config
from mice_exp.features import cached_bertscore
from mice_exp.llm.records import read_stage
from mice_exp.paths import PACKAGE_ROOT, Paths

FIXTURE = PACKAGE_ROOT / "tests" / "fixtures" / "ste_tiny.json"


def tiny_cfg() -> dict:
    return as_plain(compose_config(["llm=tiny_random", f"dataset.path={FIXTURE}", "llm.batch_size=2",
                                    "llm.max_new_tokens=6", "prompt.k_demos=2"]))


@pytest.fixture(scope="module")
def intact(tmp_path_factory, tiny_llm) -> Path:
    """A finished LLM stage of 6 calls in 3 shards, never touched."""
    return stage_of(tiny_cfg(), Paths(root=PACKAGE_ROOT, cache=tmp_path_factory.mktemp("intact")), tiny_llm).run()


@pytest.fixture
def copy(intact, tmp_path) -> Path:
    """A copy of the intact stage to damage."""
    target = tmp_path / "llm" / intact.name
    shutil.copytree(intact, target)
    return target


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def counting_batches(monkeypatch) -> list[int]:
    """Sizes of the batches the stage generates from now on."""
    sizes: list[int] = []
    real = runner.generate_batch

    def counted(llm, prompts, *args, **kwargs):
        sizes.append(len(prompts))
        return real(llm, prompts, *args, **kwargs)

    monkeypatch.setattr(runner, "generate_batch", counted)
    return sizes


@pytest.mark.parametrize("damaged", ["shard-00001.jsonl", "shard-00001.npz", "done.json", "meta.json"])
def test_a_truncated_file_is_named_set_aside_and_only_its_shard_recomputed(intact, copy, tiny_llm, monkeypatch,
                                                                          caplog, damaged):
    truncate(copy / damaged)
    generated = counting_batches(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="mice_exp.cache"):
        resumed = stage_of(tiny_cfg(), Paths(root=PACKAGE_ROOT, cache=copy.parent.parent), tiny_llm).run()
    assert resumed == copy
    warning = next(r.getMessage() for r in caplog.records if damaged in r.getMessage())
    assert f"{copy / damaged} is damaged" in warning and "set aside" in warning
    assert (copy / f"{damaged}.damaged").exists()
    assert generated == ([] if damaged in ("done.json", "meta.json") else [2])  # one shard of 2 calls, or nothing
    assert json.loads((copy / "meta.json").read_text()) == json.loads((intact / "meta.json").read_text())
    assert read_stage(resumed).records == read_stage(intact).records
    np.testing.assert_array_equal(read_stage(resumed).arrays("mean_pool"), read_stage(intact).arrays("mean_pool"))


def test_a_truncated_demos_file_is_recomputed(intact, copy, tiny_llm, caplog):
    for shard in copy.glob("shard-00002.*"):
        shard.unlink()
    (copy / "done.json").unlink()
    truncate(copy / "demos.json")
    with caplog.at_level(logging.WARNING, logger="mice_exp.cache"):
        resumed = stage_of(tiny_cfg(), Paths(root=PACKAGE_ROOT, cache=copy.parent.parent), tiny_llm).run()
    assert any("demos.json is damaged" in r.getMessage() for r in caplog.records)
    assert read_stage(resumed).records == read_stage(intact).records


def test_a_truncated_feature_cache_is_set_aside_and_recomputed(intact, tmp_path, monkeypatch, caplog):
    import mice_exp.features.bertscore as bertscore

    stage = read_stage(intact)
    calls: list[int] = []
    monkeypatch.setattr(bertscore, "bertscore_matrix",
                        lambda rows, encoder: calls.append(len(rows)) or np.arange(len(rows) * 3.0).reshape(-1, 3))
    first = cached_bertscore(stage, tmp_path, {"model": "encoder", "num_layers": 1})
    (cached,) = tmp_path.glob("*.npz")
    truncate(cached)
    with caplog.at_level(logging.WARNING, logger="mice_exp.cache"):
        again = cached_bertscore(stage, tmp_path, {"model": "encoder", "num_layers": 1})
    assert calls == [6, 6] and np.array_equal(first, again)
    assert any(f"{cached} is damaged" in r.getMessage() for r in caplog.records)
    assert cached.with_name(cached.name + ".damaged").exists()


def thirty_calls(folder: Path) -> Path:
    """STE-shaped data with 30 calls: each fixture query five times, reworded."""
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    bigger = {api: [{**item, "query": f"{item['query']} ({n})"} for item in items for n in range(5)]
              for api, items in data.items()}
    path = folder / "ste_30.json"
    path.write_text(json.dumps(bigger), encoding="utf-8")
    return path


def llm_stage_process(data: Path, cache: Path) -> subprocess.Popen:
    """``mice-exp stage=llm`` on tiny_random in its own process (this checkout, one thread)."""
    args = ["llm=tiny_random", f"dataset.path={data}", "llm.batch_size=2", "llm.max_new_tokens=16", "prompt.k_demos=2",
            f"paths.cache={cache}", "stage=llm", "tracking.enabled=false", f"hydra.run.dir={cache / 'outputs'}"]
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "mice_exp", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


@pytest.mark.slow
def test_a_run_killed_mid_stage_resumes_to_the_records_of_an_uninterrupted_one(tmp_path):
    data = thirty_calls(tmp_path)
    killed, whole = cache_sharing_models(tmp_path / "killed"), cache_sharing_models(tmp_path / "whole")
    process = llm_stage_process(data, killed)
    deadline = time.monotonic() + 300
    while not list(killed.glob("llm/*/shard-00000.jsonl")):
        assert process.poll() is None and time.monotonic() < deadline, "no shard was written"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    (partial,) = killed.glob("llm/*")
    assert not (partial / "done.json").exists(), "the stage finished before it could be killed"
    kept = len(read_stage(partial).records)
    assert llm_stage_process(data, killed).wait() == 0
    assert llm_stage_process(data, whole).wait() == 0
    (uninterrupted,) = whole.glob("llm/*")
    assert 0 < kept < 30 and uninterrupted.name == partial.name
    assert read_stage(partial).records == read_stage(uninterrupted).records
    for name in ("mean_pool", "last_token", "first_token"):
        np.testing.assert_array_equal(read_stage(partial).arrays(name), read_stage(uninterrupted).arrays(name))


def test_a_written_file_gets_the_mode_a_plain_open_gives_it(tmp_path):
    """Files written atomically (records, caches, gates) are readable by whoever may read a plain file here,
    not only their writer (mkstemp's 0600)."""
    from mice_exp.cache import write_text

    write_text(tmp_path / "written.txt", "x")
    (tmp_path / "plain.txt").write_text("x")
    assert (tmp_path / "written.txt").stat().st_mode == (tmp_path / "plain.txt").stat().st_mode
