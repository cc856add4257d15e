"""The whole pipeline on tiny_random: LLM stage, BERTScore view, estimators, metrics, MLflow run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow import MlflowClient

from mice_exp.compose import compose_config
from mice_exp.paths import PACKAGE_ROOT
from mice_exp.run import run

FIXTURE = PACKAGE_ROOT / "tests" / "fixtures" / "ste_tiny.json"


def overrides(tmp_path) -> list[str]:
    return ["llm=tiny_random", f"dataset.path={FIXTURE}", "llm.batch_size=3", "llm.max_new_tokens=6",
            "prompt.k_demos=2", f"paths.cache={tmp_path / 'cache'}", "permutations=50",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "estimator=mice_lr"]


def test_run_logs_a_finished_mlflow_run_with_table_metrics_and_artifacts(tmp_path, capsys):
    result = run(compose_config(overrides(tmp_path)))
    printed = capsys.readouterr().out
    assert "Confidence estimator" in printed and "MICE LR" in printed and "HRE" in printed
    assert "per-argument confidence on test:" in printed and "api_name lens: auroc" in printed
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    info = client.get_run(result["run_id"])
    assert info.info.status == "FINISHED"
    assert info.data.tags["estimator"] == "mice_lr" and info.data.params["llm.name"] == "tiny_random"
    for key in ("smece", "etcu_low", "etcu_medium", "etcu_high", "auc_etcu", "baseline.hre.auc_etcu",
                "prr", "aurc", "baseline.raw.prr", "baseline.nwkr.aurc", "argument.n", "argument.auroc",
                "argument.lens_smece", "api_name.n", "api_name.lens_auroc"):
        assert key in info.data.metrics
    artifacts = {a.path for a in client.list_artifacts(result["run_id"])}
    assert {"predictions.csv", "figures", "config.yaml"} <= artifacts
    assert "figures/risk_coverage.png" in {a.path for a in client.list_artifacts(result["run_id"], "figures")}


def test_a_fully_cached_run_loads_no_llm(tmp_path, monkeypatch):
    """The second run of a config reads the LLM stage, its confidence sources (here a feature column) and
    the feature view from their caches: every loader of a model fails if it is called."""
    from mice_exp.llm import model

    args = overrides(tmp_path) + ["sources.use=[p_true]", "features.sources=[p_true]", "tracking.enabled=false",
                                  "permutations=0"]
    first = run(compose_config(args))
    for loader in ("load_llm", "load_hf"):
        monkeypatch.setattr(model, loader, lambda *a, name=loader, **k: pytest.fail(f"{name}: a model was loaded"))
    again = run(compose_config(args))
    assert again["llm_cache"] == first["llm_cache"] and again["objective"] == first["objective"]


def cli(monkeypatch, capsys, args: list[str]) -> tuple[int, str]:
    """Run ``mice-exp ARGS`` in this process; return its exit status and stderr."""
    from mice_exp.__main__ import main

    monkeypatch.setattr(sys, "argv", ["mice-exp", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, capsys.readouterr().err


def test_a_user_error_is_one_line_and_the_run_is_marked_failed(tmp_path, monkeypatch, capsys):
    code, err = cli(monkeypatch, capsys, overrides(tmp_path) + [f"hydra.run.dir={tmp_path}", "features.layers=middle"])
    assert code == 2
    assert err.strip().splitlines() == ["mice-exp: error: features.layers='middle'; expected one of all, none, "
                                        "first_half, second_half, early, mid, late or a list of layer numbers"]


def test_a_missing_dataset_file_is_named_and_the_mlflow_run_is_failed(tmp_path, monkeypatch, capsys):
    code, err = cli(monkeypatch, capsys, overrides(tmp_path) + [f"hydra.run.dir={tmp_path}",
                                                                "dataset.path=/nope/tool_test.json"])
    assert code == 2 and "/nope/tool_test.json" in err and "Traceback" not in err
    runs = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()[0]
    statuses = [r.info.status for r in MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs([runs.experiment_id])]
    assert statuses == ["FAILED"]


@pytest.mark.parametrize("bad", ["llm.dtype=float8", "protocol.name=kfold", "risk.fp=5", "stage=half"])
def test_invalid_config_values_are_one_line_user_errors(tmp_path, monkeypatch, capsys, bad):
    code, err = cli(monkeypatch, capsys, overrides(tmp_path) + [f"hydra.run.dir={tmp_path}", bad])
    assert code == 2 and len(err.strip().splitlines()) == 1 and bad.split("=")[1] in err, err


def test_the_console_script_runs_as_a_module(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mice_exp", "inspect"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("mice-exp: error: usage: mice-exp inspect EXAMPLE_ID_OR_INDEX [hydra overrides]; "
                                   "expected exactly one example")


def test_a_field_corrected_estimator_runs_and_logs_its_regime_diagnostics(tmp_path, capsys, monkeypatch):
    """estimator=field: MICE LR plus the miscalibration field of the last prompt token's hidden state.

    tiny_random never writes a correct call; labels alternate by example so both classes exist."""
    from mice_exp.llm import stage

    monkeypatch.setattr(stage, "is_correct", lambda example, api, args: int(example.id.rsplit("/", 1)[-1]) % 2 == 0)
    args = overrides(tmp_path) + ["estimator=field", "estimator.base=mice_lr", "+estimator.model.field.max_epochs=2",
                                  "+estimator.model.field.sigmas=[0.5]", "+estimator.model.field.lambdas=[0.01]",
                                  "permutations=0"]
    result = run(compose_config(args))
    assert "miscalibration field on test" in capsys.readouterr().out
    info = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(result["run_id"])
    assert info.info.status == "FINISHED" and info.data.tags["estimator"] == "field_mice_lr"
    metrics = info.data.metrics
    assert 0 <= metrics["field.frac_over"] + metrics["field.frac_under"] <= 1
    assert metrics["field.sigma"] == 0.5 and "field.worst_slice_gap" in metrics
    assert not any(name.startswith("pvalue_") for name in metrics)  # permutations=0: no significance tests


def test_hidden_state_baselines_run_end_to_end_as_the_estimator_and_as_reference_rows(tmp_path, capsys, monkeypatch):
    """The best-layer probe as the run's estimator, the final-layer probe and Mahalanobis as reference rows."""
    from mice_exp.llm import stage

    monkeypatch.setattr(stage, "is_correct", lambda example, api, args: int(example.id.rsplit("/", 1)[-1]) % 2 == 0)
    args = overrides(tmp_path) + ["estimator=probe_best_layer", "compare_with=[raw,probe_last,mahalanobis]",
                                  "permutations=0"]
    result = run(compose_config(args))
    assert "Probe (best layer)" in capsys.readouterr().out
    info = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(result["run_id"])
    assert info.info.status == "FINISHED" and info.data.tags["estimator"] == "probe_best_layer"
    for key in ("auc_etcu", "prr", "aurc", "baseline.probe_last.smece", "baseline.mahalanobis.auc_etcu"):
        assert key in info.data.metrics


def test_the_llm_summary_gives_each_categorys_accuracy_when_there_are_few():
    from mice_exp.report.job import llm_summary

    records = [{"api": api, "label": label, "split": "test", "parse_error": None}
               for api, label in [("simple_python", 1), ("simple_python", 0), ("multiple", 0), ("multiple", 0)]]
    summary = llm_summary("SmolLM2-135M", records)
    assert "simple_python: 1/2 correct (accuracy 0.500, 95% interval 0.09-0.91)" in summary
    assert "multiple: 0/2 correct (accuracy 0.000, 95% interval 0.00-0.66)" in summary
    many = [{**r, "api": f"api{i}"} for i, r in enumerate(records * 3)]
    assert "api0:" not in llm_summary("SmolLM2-135M", many)


def test_a_table_on_a_handful_of_test_calls_says_it_cannot_separate_the_estimators(tmp_path):
    from mice_exp.report.job import small_test_note

    assert small_test_note(200, "smollm2_135m", tmp_path) is None
    note = small_test_note(12, "smollm2_135m", tmp_path)
    assert "12 test calls cannot separate" in note and "llm.records" not in note  # no records file here
    (tmp_path / "experiments" / "records").mkdir(parents=True)
    (tmp_path / "experiments" / "records" / "ste-smollm2_135m.jsonl.gz").touch()
    assert "llm.records=experiments/records/ste-smollm2_135m.jsonl.gz" in small_test_note(12, "smollm2_135m", tmp_path)
