"""The benchmark scripts still run against the code they measure (on tiny_random: nothing is timed here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_llm_stage_benchmark_breaks_a_tiny_stage_into_phases_and_a_floor():
    # two APIs: under prompt.demo_pool=train one API's 8 training calls cannot give a training call 8 others
    out = subprocess.run([sys.executable, "benchmarks/llm_stage.py", "--llm", "tiny_random", "--apis", "2", "--no-plain"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert out.returncode == 0, out.stderr[-2000:]
    for line in ("prefill (model forwards)", "logit lens GEMM + argmax", "stage wall", "stage wall / floor"):
        assert line in out.stdout


@pytest.mark.slow  # two `mice-exp stage=llm` runs, one of them with two workers: 2 minutes on a busy 2-core machine
def test_the_shards_benchmark_compares_one_worker_with_two():
    out = subprocess.run([sys.executable, "benchmarks/shards.py", "--llm", "tiny_random", "--apis", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert out.returncode == 0, out.stderr[-2000:]
    for line in ("1 worker  x ", "2 workers x ", "ratio (1 worker / 2 workers):", "2 workers against 1 worker x ",
                 "load before:", "load after:", "cpu:"):
        assert line in out.stdout


def test_a_resumed_reproduction_undoes_the_step_it_was_cut_off_in(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from reproduce import roll_back, start_step

    (tmp_path / "records.jsonl.gz").write_text("stage's records")
    (tmp_path / "figures.json").write_text('{"stage": {}}')
    start_step(tmp_path, "sources")
    (tmp_path / "cache" / "sources").mkdir(parents=True)
    (tmp_path / "cache" / "sources" / "p_true.npz").write_text("half of a step")
    roll_back(tmp_path, ["stage"])
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["figures.json", "records.jsonl.gz"]

    start_step(tmp_path, "sources")
    (tmp_path / "records.jsonl.gz").write_text("rewritten in place")
    with pytest.raises(SystemExit, match="'sources' was cut off after changing records.jsonl.gz"):
        roll_back(tmp_path, ["stage"])

    (tmp_path / "records.jsonl.gz").write_text("stage's records")
    start_step(tmp_path, "sources")  # cut off after its figures were kept, before its note was removed
    (tmp_path / "sources.npz").write_text("a whole step's output")
    roll_back(tmp_path, ["stage", "sources"])
    assert (tmp_path / "sources.npz").exists() and not (tmp_path / "pending.json").exists()
