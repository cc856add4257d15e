"""The whole pipeline on tiny_random: LLM stage, BERTScore view, estimators, metrics, MLflow run."""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import Any

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
    for loader in ("load_hf", "load_tokenizer"):
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


def test_a_missing_dataset_file_is_named_before_any_mlflow_run_opens(tmp_path, monkeypatch, capsys):
    """Refused in one line before the job's run opens (issue 42): no empty FAILED run is left."""
    code, err = cli(monkeypatch, capsys, overrides(tmp_path) + [f"hydra.run.dir={tmp_path}",
                                                                "dataset.path=/nope/tool_test.json"])
    assert code == 2 and "/nope/tool_test.json" in err and "Traceback" not in err
    runs = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()[0]
    statuses = [r.info.status for r in MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs([runs.experiment_id])]
    assert statuses == []


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
    from mice_exp.llm import runner

    monkeypatch.setattr(runner, "is_correct", lambda example, api, args: int(example.id.rsplit("/", 1)[-1]) % 2 == 0)
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
    from mice_exp.llm import runner

    monkeypatch.setattr(runner, "is_correct", lambda example, api, args: int(example.id.rsplit("/", 1)[-1]) % 2 == 0)
    args = overrides(tmp_path) + ["estimator=probe_best_layer", "compare_with=[raw,probe_last,mahalanobis]",
                                  "permutations=0"]
    result = run(compose_config(args))
    assert "Probe (best layer)" in capsys.readouterr().out
    info = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(result["run_id"])
    assert info.info.status == "FINISHED" and info.data.tags["estimator"] == "probe_best_layer"
    for key in ("auc_etcu", "prr", "aurc", "baseline.probe_last.smece", "baseline.mahalanobis.auc_etcu"):
        assert key in info.data.metrics


def test_the_llm_summary_gives_each_categorys_accuracy_when_there_are_few():
    from mice_exp.job import llm_summary

    records = [{"api": api, "label": label, "split": "test", "parse_error": None}
               for api, label in [("simple_python", 1), ("simple_python", 0), ("multiple", 0), ("multiple", 0)]]
    summary = llm_summary("SmolLM2-135M", records)
    assert "simple_python: 1/2 correct (accuracy 0.500, 95% interval 0.09-0.91)" in summary
    assert "multiple: 0/2 correct (accuracy 0.000, 95% interval 0.00-0.66)" in summary
    many = [{**r, "api": f"api{i}"} for i, r in enumerate(records * 3)]
    assert "api0:" not in llm_summary("SmolLM2-135M", many)


def test_a_table_on_a_handful_of_test_calls_says_it_cannot_separate_the_estimators(tmp_path):
    from mice_exp.job import small_test_note

    assert small_test_note(200, "smollm2_135m", tmp_path) is None
    note = small_test_note(12, "smollm2_135m", tmp_path)
    assert "12 test calls cannot separate" in note and "llm.records" not in note  # no records file here
    (tmp_path / "experiments" / "records").mkdir(parents=True)
    (tmp_path / "experiments" / "records" / "ste-smollm2_135m.jsonl.gz").touch()
    assert "llm.records=experiments/records/ste-smollm2_135m.jsonl.gz" in small_test_note(12, "smollm2_135m", tmp_path)


def count_instances(monkeypatch, classes: list[type]) -> dict[str, int]:
    """How many objects of each of ``classes`` are built from now on (by their own class: a subclass calling its
    parent's ``__init__`` counts once)."""
    counts: dict[str, int] = {}

    def counted(cls: type) -> Any:
        @functools.wraps(cls.__init__)  # scikit-learn reads the parameters from its signature
        def counting(self, *args, **kwargs):
            if type(self) is cls:
                counts[cls.__name__] = counts.get(cls.__name__, 0) + 1
            init(self, *args, **kwargs)

        init = cls.__init__
        return counting

    for cls in classes:
        monkeypatch.setattr(cls, "__init__", counted(cls))
    return counts


@pytest.mark.parametrize("protocol, estimators", [("holdout", 4), ("sample_efficiency", 4 + 4)])
def test_one_pipeline_builds_each_view_protocol_study_and_estimator_once(tmp_path, monkeypatch, protocol, estimators):
    """The values are checked on the config, then every object is built once and the built objects are checked:
    the run's estimator, its 3 reference rows and the sample-efficiency protocol's 4 estimators."""
    from mice_exp.estimation import Study
    from mice_exp.estimators import estimator_classes
    from mice_exp.features import view_classes
    from mice_exp.pipeline import Pipeline
    from mice_exp.protocols import Holdout, Loao, SampleEfficiency

    views, protocols = view_classes(), [Holdout, Loao, SampleEfficiency]
    counts = count_instances(monkeypatch, [*views, *protocols, Study, *estimator_classes()])
    Pipeline.from_config(compose_config(overrides(tmp_path) + [f"protocol={protocol}"]))
    assert sum(counts.get(c.__name__, 0) for c in views) == 1
    assert sum(counts.get(c.__name__, 0) for c in protocols) == 1 and counts["Study"] == 1
    assert sum(counts.values()) - 3 == estimators


OWN_VIEW = '''
from mice_exp.features.views import CosineView


class OwnView(CosineView):
    """A view of one's own, in a module of its own."""

    view = "own"
'''


def own_view(overrides: list[str], target: str) -> list[str]:
    return overrides + ["features=cosine", f"features._target_={target}", "features.view=own", "features.name=own"]


@pytest.mark.slow
def test_a_view_in_a_module_of_its_own_is_found_as_estimators_are_and_its_run_saves_a_gate(tmp_path, monkeypatch,
                                                                                           capsys):
    import mice_exp.features
    from mice_exp.features import view_classes
    from mice_exp.gate import Gate

    (tmp_path / "own_view.py").write_text(OWN_VIEW)
    monkeypatch.setattr(mice_exp.features, "__path__", [*mice_exp.features.__path__, str(tmp_path)])
    try:
        assert "OwnView" in {c.__name__ for c in view_classes()}
        args = own_view(overrides(tmp_path), "mice_exp.features.own_view.OwnView")
        run(compose_config(args + ["tracking.enabled=false", "permutations=0"]))
        folder = capsys.readouterr().out.split("gate saved: ")[1].split()[0]
        assert type(Gate.load(folder).view).__name__ == "OwnView"
    finally:
        sys.modules.pop("mice_exp.features.own_view", None)


def test_a_view_no_gate_could_load_is_refused_before_the_run(tmp_path, monkeypatch):
    """Outside mice_exp.features, a view runs (features._target_ may name any class) but its gate could not be
    loaded: refused in one line before the LLM stage, unless the run saves no gate."""
    from mice_exp.errors import UserError
    from mice_exp.pipeline import Pipeline

    (tmp_path / "elsewhere_view.py").write_text(OWN_VIEW)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        args = own_view(overrides(tmp_path), "elsewhere_view.OwnView")
        with pytest.raises(UserError, match=r"features._target_=elsewhere_view.OwnView: a gate loads only the classes "
                                            r"defined in a module of mice_exp.features"):
            Pipeline.from_config(compose_config(args))
        Pipeline.from_config(compose_config(args + ["gate.save=false"]))
        Pipeline.from_config(compose_config(args + ["protocol=loao"]))  # no single model: no gate
    finally:
        sys.modules.pop("elsewhere_view", None)
