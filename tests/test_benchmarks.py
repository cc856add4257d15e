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


def test_prediction_agreement_finds_the_call_a_perturbed_confidence_moves_across_a_threshold(tmp_path, monkeypatch):
    """Two records files that differ in one call's raw confidence: the script names the column, the predictions
    and the decision that moved; against the published predictions, the published records' raw confidence is
    reproduced exactly."""
    import argparse
    import gzip
    import json

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from prediction_agreement import compare

    published = ROOT / "experiments" / "records" / "ste-smollm2_135m.jsonl.gz"
    lines = gzip.open(published, "rt").read().splitlines()
    rows = [json.loads(line) for line in lines]
    test = next(n for n, r in enumerate(rows) if r.get("split") == "test" and 0.3 < r["raw_confidence"] < 0.45)
    rows[test]["raw_confidence"] = 0.6  # across the medium risk's tau of 0.5
    moved = tmp_path / "moved.jsonl.gz"
    with gzip.open(moved, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    args = argparse.Namespace(llm="smollm2_135m", features="conf_only", estimator="raw", protocol="holdout",
                              row="Raw Confidence", overrides=[f"paths.cache={tmp_path / 'cache'}"])
    found = compare(published, moved, args)
    assert list(found["feature_columns_that_differ"]) == ["confidence"]
    assert found["predictions_that_differ"] == 1
    assert [c[0] for c in found["decisions_that_flip"]["medium"]["calls"]] == [rows[test]["id"]]
    assert found["decisions_that_flip"]["low"]["calls"] == []
    table1 = ROOT / "experiments" / "table1" / "predictions.csv"
    again = compare(published, table1, args)  # raw confidence reads no view: the row's bertscore features do not matter
    assert again["feature_columns_that_differ"] is None and again["predictions_that_differ"] == 0
    with pytest.raises(SystemExit, match=r"row 'HRE' was made by \(estimator, protocol, features\) "
                                         r"\{\('hre', 'holdout', 'conf_only'\)\}; expected --estimator raw"):
        compare(published, table1, argparse.Namespace(**{**vars(args), "row": "HRE"}))
