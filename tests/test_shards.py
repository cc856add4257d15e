"""One LLM stage on two workers (``llm.shards=2``): the same cache folder and the same records as one
worker, whether the workers are run by hand (``llm.shard=i``) or started locally by the stage, and
whichever of them is killed and re-run."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

import mice_exp.llm.runner as runner
from conftest import cache_sharing_models, stage_of
from mice_exp.cache import read_json
from mice_exp.compose import as_plain, compose_config
from mice_exp.config import check_config
from mice_exp.errors import UserError
from mice_exp.llm.records import ARRAYS, read_stage, shards
from mice_exp.llm.shards import worker_threads
from mice_exp.paths import PACKAGE_ROOT, Paths
from mice_exp.run import run

FIXTURE = PACKAGE_ROOT / "tests" / "fixtures" / "ste_tiny.json"  # 6 calls: 3 batches of 2


def tiny_cfg(*overrides: str) -> dict:
    return as_plain(compose_config(["llm=tiny_random", f"dataset.path={FIXTURE}", "llm.batch_size=2",
                                    "llm.max_new_tokens=6", "prompt.k_demos=2", "tracking.enabled=false",
                                    *overrides]))


def paths_in(folder: Path) -> Paths:
    return Paths(root=PACKAGE_ROOT, cache=cache_sharing_models(folder))


@pytest.fixture(scope="module", autouse=True)
def threads_of_a_worker_of_two():
    """This process computes with the threads each of two local workers gets: records are
    identical bit for bit at equal threads per process, while another count can round a few CPU
    reductions differently (docs/usage.md, benchmarks/shards.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(worker_threads(2))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory, tiny_llm) -> Path:
    """The stage computed by one worker, the reference every sharded run must equal."""
    return stage_of(tiny_cfg(), paths_in(tmp_path_factory.mktemp("one")), tiny_llm).run()


def assert_same_stage(folder: Path, reference: Path) -> None:
    assert folder.name == reference.name  # llm.shards is not part of the cache key
    assert read_stage(folder).records == read_stage(reference).records
    for name in ARRAYS:
        np.testing.assert_array_equal(read_stage(folder).arrays(name), read_stage(reference).arrays(name))
    assert read_json(folder / "done.json") == read_json(reference / "done.json")


def dies_on_batch(monkeypatch, deadly: int) -> list[int]:
    """From now on the stage's generation raises KeyboardInterrupt on its ``deadly``-th batch (1-based; 0:
    never); returns the sizes of the batches it generates."""
    sizes: list[int] = []
    real = runner.generate_batch

    def generate(llm, prompts, *args, **kwargs):
        sizes.append(len(prompts))
        if len(sizes) == deadly:
            raise KeyboardInterrupt
        return real(llm, prompts, *args, **kwargs)

    monkeypatch.setattr(runner, "generate_batch", generate)
    return sizes


def test_two_workers_run_by_hand_give_one_workers_records(one_worker, tmp_path, monkeypatch, capsys):
    # mice-exp stage=llm llm.shards=2 llm.shard=0, killed after its first batch (batch 0 of 0 and 2)
    worker = [f"paths.cache={cache_sharing_models(tmp_path)}", "stage=llm", "llm.shards=2"]
    dies_on_batch(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_cfg(*worker, "llm.shard=0"))
    out = tmp_path / "llm" / one_worker.name
    assert [p.name for p in shards(out)] == ["shard-00000.jsonl"]

    generated = dies_on_batch(monkeypatch, 0)
    run(tiny_cfg(*worker, "llm.shard=0"))  # resumes: only its missing batch 2
    assert generated == [2]
    assert [p.name for p in shards(out)] == ["shard-00000.jsonl", "shard-00002.jsonl"]
    assert not (out / "done.json").exists()
    assert "worker 0 of 2 is done; 2 of the LLM stage's 3 batches are in" in capsys.readouterr().out

    assert run(tiny_cfg(*worker, "llm.shard=1")) == {"llm_cache": str(out), "complete": True}  # batch 1: done.json
    assert generated == [2, 2]
    assert "the LLM stage is complete" in capsys.readouterr().out
    assert_same_stage(out, one_worker)


def test_the_stage_starts_its_workers_itself_and_a_killed_one_resumes(one_worker, tmp_path):
    cfg, paths = tiny_cfg("llm.shards=2"), paths_in(tmp_path)
    out = tmp_path / "llm" / one_worker.name
    with ThreadPoolExecutor(1) as pool:  # mice-exp stage=llm llm.shards=2, its worker 1 killed (OOM, scancel)
        running = pool.submit(stage_of(cfg, paths).run)
        victim = None
        while victim is None and not running.done():
            victim = next((p for p in psutil.Process().children() if p.cmdline()[-2:] == [
                str(out / "workers" / "config.json"), "1"]), None)
            time.sleep(0.05)
        assert victim is not None, "worker 1 never started"
        victim.kill()
        with pytest.raises(UserError) as failed:
            running.result()
    message = str(failed.value)
    assert "\n" not in message
    assert f"worker 1 of 2 (signal SIGKILL; log {out / 'workers' / 'worker-1-of-2.log'}) failed" in message
    assert "2 of 3 batches are kept" in message
    assert [p.name for p in shards(out)] == ["shard-00000.jsonl", "shard-00002.jsonl"]  # worker 0's, kept

    first_log = (out / "workers" / "worker-0-of-2.log").read_text()
    assert stage_of(cfg, paths).run() == out  # the same command: only worker 1 restarts, computes batch 1
    assert_same_stage(out, one_worker)
    assert "computing the LLM stage" in (out / "workers" / "worker-1-of-2.log").read_text()
    assert (out / "workers" / "worker-0-of-2.log").read_text() == first_log  # worker 0 had nothing left to do


@pytest.mark.parametrize("overrides, expected", [
    (["llm.shards=0"], "llm.shards=0; expected a positive integer"),
    (["llm.shards=2", "llm.shard=2"],
     "llm.shard=2 is not one of the llm.shards=2 workers; expected 0 <= llm.shard < 2"),
    (["llm.shards=2", "llm.shard=-1"], "llm.shard=-1 is not one of the llm.shards=2 workers"),
])
def test_a_shard_setting_out_of_range_is_one_line(overrides, expected):
    with pytest.raises(UserError, match=expected) as error:
        check_config(tiny_cfg(*overrides))
    assert "\n" not in str(error.value)


def test_more_shards_than_batches_is_one_line_naming_both(tmp_path):
    with pytest.raises(UserError) as error:
        stage_of(tiny_cfg("llm.shards=4"), paths_in(tmp_path)).run()
    assert str(error.value) == ("llm.shards=4 is more than the stage's 3 batches (6 calls, llm.batch_size=2); "
                                "expected llm.shards <= 3: fewer shards or a smaller llm.batch_size")
