"""A real multirun: 2 x 2 jobs on 2 CPU workers share one LLM-stage computation and log 4 MLflow runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow import MlflowClient

from mice_exp.paths import PACKAGE_ROOT

FIXTURE = PACKAGE_ROOT / "tests" / "fixtures" / "ste_tiny.json"


@pytest.mark.slow
def test_two_by_two_sweep_on_two_workers(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=cpu_pool", "hydra.launcher.n_cpu_workers=2", f"hydra.sweep.dir={sweep}",
            "llm=tiny_random", f"dataset.path={FIXTURE}", "llm.batch_size=3", "llm.max_new_tokens=6",
            "prompt.k_demos=2", f"paths.cache={tmp_path / 'cache'}", "permutations=20",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "estimator=hre,mice_lr", "risk=low,high"]
    proc = subprocess.run([sys.executable, "-m", "mice_exp", *args], capture_output=True, text=True,
                          cwd=PACKAGE_ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mice_exp")
    runs = client.search_runs([experiment.experiment_id])
    job_runs = [r for r in runs if r.data.tags.get("estimator")]
    assert sorted(r.info.status for r in job_runs) == ["FINISHED"] * 4
    assert {(r.data.tags["estimator"], r.data.tags["risk"]) for r in job_runs} == {
        ("hre", "low"), ("hre", "high"), ("mice_lr", "low"), ("mice_lr", "high")}
    logs = [p.read_text() for p in sweep.glob("*/*.log")]
    assert sum("computing the LLM stage" in text for text in logs) == 1
    assert len(list((tmp_path / "cache" / "llm").glob("*/done.json"))) == 1
    report = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "mice_exp", "report", "--sweep", str(sweep), "--tracking-uri",
                           f"sqlite:///{tmp_path / 'mlflow.db'}", "--out", str(report)],
                          capture_output=True, text=True, cwd=PACKAGE_ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (report / "results.md").read_text()
    for row in ("Raw Confidence", "HRE", "NWKR", "MICE LR"):
        assert row in table
    rerun = subprocess.run([sys.executable, "-m", "mice_exp", *args], capture_output=True, text=True,
                           cwd=PACKAGE_ROOT, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("estimator")]
    assert len(after) == 4  # every job was skipped: its FINISHED run has the same resolved config
