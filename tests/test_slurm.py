"""The Slurm launcher (``hydra/launcher=slurm``) on a real Slurm: a tiny_random sweep, then cancel and re-run.

Skipped where no Slurm answers. CI starts a one-node cluster with accounting first
(``bash tests/cluster/start_slurm.sh`` in ``.ci/run``; as root, about 10 s after its apt install);
on a machine of your own run that script, or point Slurm's client at a cluster where test jobs may run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cache_sharing_models
from mice_exp.paths import PACKAGE_ROOT
from mice_exp.tracking.schema import reused_tag

FIXTURE = PACKAGE_ROOT / "tests" / "fixtures" / "ste_tiny.json"
SWEEP_TIMEOUT_S = 600


def _answer(*args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None


def no_slurm() -> str | None:
    """Why no Slurm can run the test here, or None when sinfo shows a usable node and sacct answers."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no Slurm client here (sinfo / sbatch); CI starts one with tests/cluster/start_slurm.sh"
    info = _answer("sinfo", "-h", "-o", "%T")
    if info is None or info.returncode != 0:
        return f"sinfo fails: {(info.stderr.strip() if info else 'no answer')[:200]}"
    if not {"idle", "mixed", "allocated", "completing"} & set(info.stdout.split()):
        return f"no Slurm node is up (sinfo states: {' '.join(sorted(set(info.stdout.split()))) or 'none'})"
    accounting = _answer("sacct", "-n", "-X", "-S", "now-1hours")
    if accounting is None or accounting.returncode != 0:
        return "sacct does not answer (the test reads task states from Slurm's accounting)"
    return None


REASON = no_slurm()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no Slurm: {REASON}")


def tiny_args(tmp: Path) -> list[str]:
    """The tiny_random run every job of these tests makes (its cache under ``tmp``)."""
    return ["llm=tiny_random", f"dataset.path={FIXTURE}", "llm.batch_size=3", "llm.max_new_tokens=6",
            "prompt.k_demos=2", f"paths.cache={cache_sharing_models(tmp / 'cache')}", "permutations=20",
            f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}"]


def sweep_args(tmp: Path, sweep: Path, *extra: str) -> list[str]:
    """A tiny_random sweep through hydra/launcher=slurm: 1 CPU and 2 GB per task, polled every second."""
    return ["-m", "hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2",
            "hydra.launcher.timeout_min=15", "hydra.launcher.poll_s=1", f"hydra.sweep.dir={sweep}",
            *tiny_args(tmp), "estimator=mice_lr,mice_rf", *extra]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}


def mice_exp(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mice_exp", *args], capture_output=True, text=True,
                          cwd=PACKAGE_ROOT, env=env(), timeout=SWEEP_TIMEOUT_S)


def array_id(output: str) -> str:
    for line in output.splitlines():
        if " as Slurm job " in line:
            return line.split(" as Slurm job ")[1].split()[0]
    raise AssertionError(f"no submitted Slurm job in the output:\n{output[-3000:]}")


def sacct(job: str) -> dict[str, tuple[str, str]]:
    """Task id -> (job name, state) of Slurm job ``job`` (sacct may lag a few seconds behind the tasks)."""
    rows = {}
    for _ in range(30):
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,State,JobName"],
                             capture_output=True, text=True, timeout=20).stdout
        rows = {}
        for line in out.splitlines():
            task, state, name = line.split("|", 2)
            rows[task] = (name, state)
        if rows and all(state.split()[0] not in ("PENDING", "RUNNING", "COMPLETING") for _, state in rows.values()):
            break
        time.sleep(1)
    return rows


def job_runs(tmp: Path) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mice_exp")
    return [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("estimator")]


def test_a_sweep_runs_as_one_array_on_slurm(tmp_path):
    sweep = tmp_path / "sweep"
    done = mice_exp(sweep_args(tmp_path, sweep))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    job = array_id(output)
    tasks = sacct(job)
    assert sorted(tasks) == [f"{job}_0", f"{job}_1"], tasks
    assert {state for _, state in tasks.values()} == {"COMPLETED"}, tasks
    assert {name for name, _ in tasks.values()} == {"mice_exp:estimator=mice_lr,mice_rf"}  # not __main__
    assert f"slurm job {job}_[0-1]: 2 done" in output  # the waiting launcher's last state line

    runs = job_runs(tmp_path)
    assert sorted((r.data.tags["estimator"], r.info.status) for r in runs) == [("mice_lr", "FINISHED"),
                                                                               ("mice_rf", "FINISHED")]
    assert {r.data.tags["sweep"] for r in runs} == {str(sweep)}
    assert len(list((tmp_path / "cache" / "llm").glob("*/done.json"))) == 1  # the LLM stage, computed once
    assert sum("computing the LLM stage" in p.read_text() for p in sweep.glob("*/*.log")) == 1


def test_one_llm_stage_sharded_over_an_array_gives_one_workers_records(tmp_path):
    """llm.shards=2 'llm.shard=range(2)': each array task runs one worker's batches into one stage folder
    (one thread each, as the reference), which ends whole, with one worker's records."""
    from mice_exp.llm.records import read_stage

    sharded = tmp_path / "sharded"
    args = ["-m", "hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2",
            "hydra.launcher.timeout_min=15", "hydra.launcher.poll_s=1", f"hydra.sweep.dir={tmp_path / 'sweep'}",
            *tiny_args(sharded), "stage=llm", "llm.shards=2", "llm.shard=range(2)"]
    done = mice_exp(args)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    tasks = sacct(array_id(output))
    assert len(tasks) == 2 and {state for _, state in tasks.values()} == {"COMPLETED"}, tasks
    one = mice_exp([*tiny_args(tmp_path / "one"), "stage=llm"])
    assert one.returncode == 0, (one.stdout + one.stderr)[-4000:]
    [folder] = (sharded / "cache" / "llm").glob("*/done.json")
    [reference] = (tmp_path / "one" / "cache" / "llm").glob("*/done.json")
    assert folder.parent.name == reference.parent.name  # llm.shards is not in the cache key
    assert read_stage(folder.parent).records == read_stage(reference.parent).records


@pytest.mark.slow  # about 2 min of sweeps, then 3 min of `mice-exp report` (on a busy 2-core machine)
def test_a_cancelled_job_is_killed_in_mlflow_and_a_rerun_runs_only_it(tmp_path):
    """scancel one running task: the other finishes, the launcher lists it in one line, its run is KILLED;
    the same command again submits that job alone, every job ends FINISHED and the re-run's report has both."""
    sweep = tmp_path / "sweep"
    launcher = subprocess.Popen([sys.executable, "-m", "mice_exp", *sweep_args(tmp_path, sweep)], cwd=PACKAGE_ROOT,
                                env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + SWEEP_TIMEOUT_S
        task = None
        while task is None and time.monotonic() < deadline and launcher.poll() is None:
            for log in sweep.glob(".submitit/*_1/*_log.out"):  # task 1's stdout: its MLflow run is open
                if "MLflow run" in log.read_text(errors="replace"):
                    task = log.parent.name
            time.sleep(0.3)
        assert task is not None, "task 1 never opened its MLflow run"
        subprocess.run(["scancel", task], check=True, timeout=20)
        output, _ = launcher.communicate(timeout=SWEEP_TIMEOUT_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    job = task.split("_")[0]
    assert launcher.returncode != 0, output[-4000:]
    cancelled = [line for line in output.splitlines() if line.startswith("[") and f"job {task} (#1:" in line]
    assert len(cancelled) == 1 and "CANCELLED" in cancelled[0], output[-4000:]
    assert "1 of 2 jobs did not complete (1 CANCELLED" in output
    assert "Traceback" not in output and "UncompletedJobError" not in output
    tasks = sacct(job)
    assert tasks[f"{job}_0"][1] == "COMPLETED" and tasks[task][1].startswith("CANCELLED"), tasks  # the other ran on
    statuses = {r.data.tags["estimator"]: r.info.status for r in job_runs(tmp_path)}
    assert statuses == {"mice_lr": "FINISHED", "mice_rf": "KILLED"}
    killed = next(r for r in job_runs(tmp_path) if r.info.status == "KILLED")
    assert killed.data.tags["error"].startswith("Terminated: SIGTERM: the Slurm job was cancelled")

    rerun_sweep = tmp_path / "rerun"
    rerun = mice_exp(sweep_args(tmp_path, rerun_sweep))
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, output[-4000:]
    assert "skipping 1 of 2 jobs" in output and "submitted 1 job(s)" in output
    again = sacct(array_id(output))
    assert [state for _, state in again.values()] == ["COMPLETED"], again  # one job, not an array slot per job
    runs = job_runs(tmp_path)
    assert sorted((r.data.tags["estimator"], r.info.status) for r in runs) == [
        ("mice_lr", "FINISHED"), ("mice_rf", "FINISHED"), ("mice_rf", "KILLED")]
    skipped = next(r for r in runs if r.data.tags["estimator"] == "mice_lr")
    assert skipped.data.tags.get(reused_tag(str(rerun_sweep))) == "true"  # the skipped job's run joins the re-run

    # the report of the re-run's sweep holds both jobs: the one it ran and the one it skipped (~3 min of smECE)
    report = mice_exp(["report", "--sweep", str(rerun_sweep), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                       "--out", str(tmp_path / "report"), "--no-log"])
    assert report.returncode == 0, report.stderr[-3000:]
    import pandas as pd

    rows = pd.read_csv(tmp_path / "report" / "results.csv")
    finished = {r.info.run_id for r in runs if r.info.status == "FINISHED"}
    assert set(rows["run_id"].dropna()) == finished, rows[["row", "run_id"]]
