"""MLflow tracking against a real SQLite store in a temporary project folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from mice_exp.errors import UserError
from mice_exp.jsonable import jsonable
from mice_exp.paths import PACKAGE_ROOT
from mice_exp.tracking import (
    NullRun,
    artifact_location,
    ensure_experiment,
    flatten_params,
    git_tags,
    tracked_run,
    tracking_uri,
)
from mice_exp.tracking.params import MAX_PARAM_VALUE_LENGTH, truncate
from mice_exp.tracking.store import get_or_create_experiment, open_client

CFG = {"uri": None, "experiment": "mice_exp_test", "enabled": True}


# ----------------------------------------------------------------------------- pure helpers


def test_default_config_file_has_the_documented_keys():
    conf = OmegaConf.to_container(OmegaConf.load(PACKAGE_ROOT / "conf" / "tracking" / "default.yaml"))
    assert conf["uri"] is None and conf["experiment"] == "mice_exp" and conf["enabled"] is True


def test_tracking_uri_resolves_against_the_project_root(tmp_path):
    root = tmp_path / "proj"
    assert tracking_uri({"uri": None}, root) == f"sqlite:///{root.resolve()}/mlruns/mlflow.db"
    assert tracking_uri({"uri": "sqlite:///db/x.db"}, root) == f"sqlite:///{root.resolve()}/db/x.db"
    assert tracking_uri({"uri": "sqlite:////abs/x.db"}, root) == "sqlite:////abs/x.db"
    assert tracking_uri({"uri": "http://host:5000"}, root) == "http://host:5000"
    assert tracking_uri({"tracking": {"uri": None}}, root).endswith("/mlruns/mlflow.db")  # whole config
    with pytest.raises(UserError, match="no scheme"):
        tracking_uri({"uri": "mlruns"}, root)


def test_artifact_location_is_never_the_working_directory(tmp_path):
    root = tmp_path / "proj"
    assert artifact_location({"uri": None}, root) == (root.resolve() / "mlruns" / "artifacts").as_uri()
    assert artifact_location({"uri": "sqlite:///elsewhere/m.db"}, root) == (
        root.resolve() / "elsewhere" / "artifacts"
    ).as_uri()
    assert artifact_location({"uri": "https://mlflow.example.org"}, root) is None  # the server decides
    assert artifact_location({"uri": None, "artifact_location": "art"}, root) == (root.resolve() / "art").as_uri()


def test_flattening_is_deterministic_and_keeps_every_value():
    a = {"llm": {"name": "m", "layers": [1, 2, 3], "stop": None}, "lr": 0.1, "ok": True,
         "demos": [{"k": 4}, {"k": 5, "tags": ["x"]}], "empty": {}, "none_list": []}
    b = {"none_list": [], "empty": {}, "demos": [{"k": 4}, {"tags": ["x"], "k": 5}], "ok": True, "lr": 0.1,
         "llm": {"stop": None, "layers": [1, 2, 3], "name": "m"}}
    flat = flatten_params(a)
    assert flat == flatten_params(b)
    assert list(flat) == sorted(flat)
    assert flat == {
        "demos.0.k": "4",
        "demos.1.k": "5",
        "demos.1.tags": '["x"]',
        "empty": "{}",
        "llm.layers": "[1, 2, 3]",
        "llm.name": "m",
        "llm.stop": "null",
        "lr": "0.1",
        "none_list": "[]",
        "ok": "true",
    }


def test_flattening_resolves_omegaconf_and_numpy_values():
    cfg = OmegaConf.create({"a": 3, "b": "${a}", "c": {"x": 0.5}})
    assert flatten_params(cfg) == {"a": "3", "b": "3", "c.x": "0.5"}
    assert flatten_params({"x": np.float32(0.5), "n": np.int64(7), "v": [np.int64(1)]}) == {
        "n": "7", "v": "[1]", "x": "0.5"}


def test_numpy_values_are_written_as_python_ones():
    """What a gate's ``gate.json``, an MLflow artifact and a param are written from (``json.dumps`` of a numpy
    integer fails, and ``default=str`` writes it as a string)."""
    value = {"n": np.int64(7), 1: (np.float32(0.5), np.arange(2)), "path": Path("a/b"),
             "cfg": OmegaConf.create({"x": 1})}
    assert jsonable(value) == {"n": 7, "1": [0.5, [0, 1]], "path": "a/b", "cfg": {"x": 1}}
    assert json.dumps(jsonable(np.float64(0.25))) == "0.25"


def test_flattening_sanitises_keys_without_merging_them():
    flat = flatten_params({"a/b": 1, "a_b": 2, "x=y": 3, "k" * 300: 4})
    assert len(flat) == 4
    assert all(len(k) <= 250 for k in flat)
    assert flat["a_b"] == "2"  # the key that was already valid keeps its name
    assert {"1", "2", "3", "4"} == set(flat.values())
    assert flatten_params({"k" * 300: 4, "x=y": 3, "a_b": 2, "a/b": 1}) == flat  # order-independent


def test_long_values_are_truncated_with_a_marker():
    value = "v" * 10_000
    cut = truncate(value)
    assert len(cut) == MAX_PARAM_VALUE_LENGTH
    assert cut.startswith("v" * 1000) and "truncated: 10000 chars" in cut
    assert truncate("short") == "short"
    assert truncate(value) == cut and truncate("w" * 10_000) != cut  # the hash tells values apart


def test_git_tags_outside_a_repository(tmp_path):
    assert git_tags(tmp_path) == {"git.dirty": "unknown"}


def test_git_tags_commit_and_dirty_flag(tmp_path):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    run = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True, env=env)  # noqa: E731
    run("init", "-q")
    (tmp_path / "f.txt").write_text("1")
    run("add", "f.txt")
    run("commit", "-q", "-m", "c")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_tags(tmp_path) == {"git.commit": head, "mlflow.source.git.commit": head, "git.dirty": "false"}
    (tmp_path / "new.txt").write_text("untracked")
    assert git_tags(tmp_path)["git.dirty"] == "true"


def test_disabled_tracking_is_a_no_op(tmp_path):
    with tracked_run({**CFG, "enabled": False}, tmp_path, "quick", {"a": 1}, {"llm": "x"}) as run:
        assert isinstance(run, NullRun) and run.run_id is None
        assert run.log_metrics({"m": 1.0, "nested": {"n": 2}}) == {"m": 1.0, "nested.n": 2.0}
        run.log_text("t", "t.txt")
        run.log_dict({"a": 1}, "a.json")
        run.log_figure(None, "f.png")
        run.log_table(pd.DataFrame({"a": [1]}), "t.csv")
        with pytest.raises(ValueError, match="csv or .parquet"):
            run.log_table(pd.DataFrame({"a": [1]}), "t.xlsx")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- a real store


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project folder whose embedded store is migrated once for the whole module."""
    root = tmp_path_factory.mktemp("project")
    ensure_experiment(CFG, root)
    return root


@pytest.fixture()
def client(project):
    return open_client(tracking_uri(CFG, project))


@pytest.fixture()
def elsewhere(tmp_path, monkeypatch):
    """Run from an unrelated working directory, to check nothing is written there."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def _artifacts(client, run_id, path=None):
    out = []
    for item in client.list_artifacts(run_id, path):
        out.extend(_artifacts(client, run_id, item.path) if item.is_dir else [item.path])
    return sorted(out)


def test_a_run_logs_params_metrics_and_artifacts_and_finishes(project, client, elsewhere, tmp_path):
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().plot([0, 1], [0, 1])
    extra = tmp_path / "notes.md"
    extra.write_text("# notes")
    params = {"llm": {"name": "smollm2", "layers": [3, 5]}, "estimator": {"name": "mice_rf", "n": 100}}
    tags = {"llm": "smollm2", "dataset": "ste", "features": "bertscore", "estimator": "mice_rf", "sweep": None}
    with tracked_run(CFG, project, "job-0", params, tags) as run:
        run_id = run.run_id
        logged = run.log_metrics({"test": {"smece": 0.05, "auc_etcu": np.float64(0.12)}, "note": "text"})
        run.log_metrics({"curve": 0.5}, step=3)
        run.log_dict({"a": np.array([1, 2]), "b": np.float64(0.5)}, "results/summary.yaml")
        run.log_text("hello", "notes.txt")
        run.log_figure(fig, "figures/line.png")
        run.log_table(pd.DataFrame({"p": [0.1, 0.9], "y": [0, 1]}), "tables/preds.parquet")
        run.log_table(pd.DataFrame({"p": [0.1, 0.9]}), "tables/preds.csv")
        run.log_artifact(extra, "docs")
        run.log_params({"llm.name": "smollm2"})  # the same value again: skipped, not an error
        with pytest.raises(ValueError, match="immutable"):
            run.log_params({"llm.name": "other"})
    assert logged == {"test.smece": 0.05, "test.auc_etcu": 0.12}

    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.info.end_time is not None
    assert got.info.run_name == "job-0"
    assert got.data.params == {"llm.name": "smollm2", "llm.layers": "[3, 5]", "estimator.name": "mice_rf",
                               "estimator.n": "100"}
    assert got.data.metrics == {"test.smece": 0.05, "test.auc_etcu": 0.12, "curve": 0.5}
    assert client.get_metric_history(run_id, "curve")[0].step == 3
    assert {k: got.data.tags[k] for k in ("llm", "dataset", "features", "estimator")} == {
        "llm": "smollm2", "dataset": "ste", "features": "bertscore", "estimator": "mice_rf"}
    assert "sweep" not in got.data.tags and "git.dirty" in got.data.tags
    assert _artifacts(client, run_id) == [
        "config.yaml", "docs/notes.md", "figures/line.png", "notes.txt", "results/summary.yaml",
        "tables/preds.csv", "tables/preds.parquet"]
    local = Path(got.info.artifact_uri.removeprefix("file://"))
    assert local.is_relative_to(project / "mlruns" / "artifacts")
    assert pd.read_parquet(local / "tables" / "preds.parquet")["y"].tolist() == [0, 1]
    assert (local / "figures" / "line.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (local / "results" / "summary.yaml").read_text() == "a:\n- 1\n- 2\nb: 0.5\n"
    assert list(elsewhere.iterdir()) == []  # nothing in the working directory


def test_a_run_that_raises_is_failed_with_the_error_tag(project, client):
    with pytest.raises(RuntimeError, match="estimator exploded"):
        with tracked_run(CFG, project, "job-bad", {"a": 1}, {"estimator": "x"}) as run:
            run_id = run.run_id
            run.log_metrics({"before": 1.0})
            raise RuntimeError("estimator exploded")
    got = client.get_run(run_id)
    assert got.info.status == "FAILED" and got.info.end_time is not None
    assert got.data.tags["error"] == "RuntimeError: estimator exploded"
    assert got.data.metrics == {"before": 1.0}
    assert "error.txt" in _artifacts(client, run_id)


def test_the_stores_answers_reach_the_caller_and_only_failures_become_one_line(project):
    """A second gate under one name is its next version (register_gate catches "already exists"),
    so the guard must not turn that answer into "the store failed"."""
    from mlflow.exceptions import MlflowException

    from mice_exp.gate.registry import register_gate

    with tracked_run(CFG, project, "job-gate") as run:
        run.log_text("gate", "gate/spec.txt")
        first, second = (register_gate(run.client, run.run_id, "answers-test") for _ in range(2))
        assert (int(first.version), int(second.version)) == (1, 2)
        with pytest.raises(MlflowException) as missing:  # an answer, unchanged
            run.client.get_registered_model("no-such-model")
        assert missing.value.error_code == "RESOURCE_DOES_NOT_EXIST"
        with pytest.raises(UserError, match="the MLflow store .* failed"):  # a failure, one line
            run.client.log_metric(run.run_id, "bad", float("nan"), step="not a step")


def test_an_interrupted_run_is_killed(project, client):
    with pytest.raises(KeyboardInterrupt):
        with tracked_run(CFG, project, "job-int") as run:
            run_id = run.run_id
            raise KeyboardInterrupt
    assert client.get_run(run_id).info.status == "KILLED"


def test_sigterm_ends_the_run_killed_and_gives_the_handler_back(project, client):
    """scancel (or a pool stopping its worker) sends SIGTERM: the run must not stay RUNNING."""
    import signal
    import time

    from mice_exp.tracking.run import Terminated

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        with tracked_run(CFG, project, "job-term") as run:
            run_id = run.run_id
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # the handler raises at once
    got = client.get_run(run_id)
    assert got.info.status == "KILLED"
    assert got.data.tags["error"].startswith("Terminated: SIGTERM")
    assert signal.getsignal(signal.SIGTERM) == before


def test_sigterm_at_slurms_time_limit_fails_the_run(project, client, monkeypatch):
    import signal
    import time

    from mice_exp.tracking import run as tracking_run

    monkeypatch.setattr(tracking_run, "slurm_end_reason", lambda: "TimeLimit")  # squeue's reason at the time limit
    with pytest.raises(tracking_run.Terminated):
        with tracked_run(CFG, project, "job-timeout") as run:
            run_id = run.run_id
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
    got = client.get_run(run_id)
    assert got.info.status == "FAILED" and "time limit" in got.data.tags["error"]


def test_long_params_round_trip_truncated(project, client):
    long = "x" * 7000
    with tracked_run(CFG, project, "job-long", {"prompt": {"template": long}, "k": "v"}) as run:
        run_id = run.run_id
    params = client.get_run(run_id).data.params
    assert len(params["prompt.template"]) == MAX_PARAM_VALUE_LENGTH
    assert params["prompt.template"] == truncate(long)
    assert params["k"] == "v"


def test_many_params_are_logged_in_batches(project, client):
    cfg = {"g": {f"p{i:03d}": i for i in range(250)}}  # log_batch takes at most 100 params
    with tracked_run(CFG, project, "job-wide", cfg) as run:
        run_id = run.run_id
    assert len(client.get_run(run_id).data.params) == 250


def test_get_or_create_tolerates_a_concurrent_creator(client):
    class LateReader:
        """Says the experiment does not exist the first time: another process creates it meanwhile."""

        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def get_experiment_by_name(self, name):
            self.calls += 1
            return None if self.calls == 1 else self.inner.get_experiment_by_name(name)

        def __getattr__(self, item):
            return getattr(self.inner, item)

    existing = client.create_experiment("raced")
    assert get_or_create_experiment(LateReader(client), "raced", None) == existing


def test_a_deleted_experiment_is_restored(client):
    exp = client.create_experiment("deleted_one")
    client.delete_experiment(exp)
    assert get_or_create_experiment(client, "deleted_one", None) == exp
    assert client.get_experiment(exp).lifecycle_stage == "active"


def test_hydra_callback_prepares_the_experiment_before_a_sweep(project, client, capsys):
    from mice_exp.tracking.hydra_callback import PrepareTracking

    config = OmegaConf.create({"paths": {"root": str(project), "cache": ".cache"},
                               "tracking": {**CFG, "experiment": "sweep_prepared"},
                               "hydra": {"sweep": {"dir": "multirun/x"}, "overrides": {"task": ["seed=1"]}}})
    PrepareTracking().on_multirun_start(config)
    experiment = client.get_experiment_by_name("sweep_prepared")
    assert experiment.lifecycle_stage == "active"
    printed = capsys.readouterr().out
    assert printed.startswith(f"MLflow sweep run: http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs/")
    assert "all runs: http://127.0.0.1:5000/" in printed
    config.tracking.enabled = False
    config.tracking.experiment = "never_made"
    PrepareTracking().on_multirun_start(config)
    assert client.get_experiment_by_name("never_made") is None


@pytest.mark.slow
def test_parallel_jobs_on_a_fresh_store(tmp_path):
    """Four processes start at once on an empty store: one migrates, all log, none fails."""
    script = textwrap.dedent(
        f"""
        import sys
        from mice_exp.tracking import tracked_run
        with tracked_run({CFG!r}, sys.argv[1], "par-" + sys.argv[2], {{"job": int(sys.argv[2])}}) as run:
            run.log_metrics({{"x": 1.0}})
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(i)], stderr=subprocess.PIPE)
             for i in range(4)]
    errors = [p.communicate(timeout=240)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    client = open_client(tracking_uri(CFG, tmp_path))
    exp = client.get_experiment_by_name(CFG["experiment"])
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.params["job"] for r in runs) == ["0", "1", "2", "3"]
    assert {r.info.status for r in runs} == {"FINISHED"}
