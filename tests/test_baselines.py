"""Baselines are composed by Hydra (``baselines.<key>`` in conf/config.yaml), so an override on the
command line reaches the reference rows, a field correction's base and the sample-efficiency grid."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from mice_exp.compose import as_plain, compose_config
from mice_exp.estimation import Study
from mice_exp.paths import PACKAGE_ROOT
from mice_exp.pipeline import Pipeline
from mice_exp.protocols import Holdout, Loao
from test_significance import feature_set

CONF = PACKAGE_ROOT / "conf"


def test_every_conf_estimator_is_composed_under_baselines():
    cfg = compose_config([])
    assert sorted(cfg.baselines) == sorted(p.stem for p in CONF.glob("estimator/*.yaml"))
    assert cfg.baselines.hre.model.n_bins == 25 and cfg.baselines.mice_rf.model.seed == cfg.seed


def test_an_override_reaches_the_fitted_reference_row():
    fs = feature_set()
    rows = {}
    for n_bins in (None, 2):
        overrides = ["compare_with=[raw,hre]", "estimator=mice_lr", "permutations=0", "n_jobs=1"]
        overrides += [f"baselines.hre.model.n_bins={n_bins}"] if n_bins else []
        result = Holdout().run(Study.from_config(as_plain(compose_config(overrides))), fs)
        rows[n_bins] = next(r for r in result.rows if r.key == "hre")
    assert rows[None].estimator.n_bins == 25 and rows[2].estimator.n_bins == 2
    assert len(np.unique(rows[2].p)) <= 2 < len(np.unique(rows[None].p))  # two bins: two probabilities


def test_an_override_reaches_a_field_corrections_base():
    cfg = as_plain(compose_config(["estimator=field", "estimator.base=hre", "baselines.hre.model.n_bins=3"]))
    assert Study.from_config(cfg).main.estimator.base.n_bins == 3


def test_only_the_baselines_a_run_reads_are_kept_for_its_params():
    field = compose_config(["estimator=field", "estimator.base=mice_lr", "compare_with=[raw,hre]"])
    assert list(Pipeline.from_config(field).config["baselines"]) == ["raw", "hre", "mice_lr"]
    sample = compose_config(["protocol=sample_efficiency"])
    assert list(Pipeline.from_config(sample).config["baselines"]) == ["raw", "hre", "nwkr", "mice_lr", "mice_rf"]


@pytest.mark.parametrize("bad, expected", [
    ("compare_with=[raw,hre,nope]", "compare_with names 'nope', which is not a composed estimator"),
    ("baselines.hre.model._target_=nope.Nope", "estimator 'hre': Error locating target 'nope.Nope'"),
])
def test_a_bad_baseline_is_one_line_before_anything_loads(tmp_path, monkeypatch, capsys, bad, expected):
    from test_errors import base, cli, one_error_line

    from mice_exp.llm import model

    monkeypatch.setattr(model, "load_hf", lambda *a, **k: pytest.fail("a model was loaded"))
    code, _, err = cli(monkeypatch, capsys, [*base(tmp_path), bad])
    assert code == 2 and expected in one_error_line(err), err


def test_a_command_line_override_reaches_the_logged_baseline(tmp_path, monkeypatch, capsys):
    """``mice-exp baselines.hre.model.n_bins=2``: the HRE reference row of the MLflow run was fitted with
    2 bins (its test predictions take at most 2 values) and the run's params say so."""
    import pandas as pd
    from mlflow import MlflowClient

    from mice_exp.__main__ import main
    from mice_exp.llm import runner
    from test_errors import base

    monkeypatch.setattr(runner, "is_correct", lambda example, api, args: int(example.id.rsplit("/", 1)[-1]) % 2 == 0)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*base(tmp_path), "tracking.enabled=true", f"tracking.uri={store}", "estimator=mice_lr",
            "compare_with=[raw,hre]", "permutations=0", "baselines.hre.model.n_bins=2"]
    monkeypatch.setattr(sys, "argv", ["mice-exp", *args])
    main()
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("mice_exp").experiment_id])
    assert run.data.params["baselines.hre.model.n_bins"] == "2" and "baselines.mice_rf.key" not in run.data.params
    predictions = pd.read_csv(client.download_artifacts(run.info.run_id, "predictions.csv", str(tmp_path)))
    assert predictions["p_hre"].nunique() <= 2


@pytest.mark.parametrize("estimator", ["raw", "hre", "nwkr"])
def test_a_run_of_a_reference_estimator_prints_its_row_once(estimator):
    """``mice-exp estimator=raw``: the run's row is the reference row itself, so the console table shows it once."""
    overrides = [f"estimator={estimator}", "compare_with=[raw,hre,nwkr]", "permutations=0", "n_jobs=1"]
    outcome = Holdout().run(Study.from_config(as_plain(compose_config(overrides))), feature_set())
    printed = [line[:28].strip() for line in outcome.text.split("\n\n")[0].splitlines()[3:-1]]
    assert sorted(printed) == ["HRE", "NWKR", "Raw Confidence"] and printed[-1] == outcome.rows[-1].name
    assert len(outcome.rows) == 4  # every row is still scored and logged (the reference's as baseline.*)


def test_a_zero_shot_run_of_a_reference_estimator_prints_both_rows():
    """Under leave-one-API-out ``estimator=hre`` is zero-shot HRE, another row than the holdout reference."""
    overrides = ["estimator=hre", "protocol=loao", "compare_with=[raw,hre,nwkr]", "permutations=0", "n_jobs=1"]
    outcome = Loao().run(Study.from_config(as_plain(compose_config(overrides))), feature_set())
    printed = [line[:28].strip() for line in outcome.text.split("\n\n")[0].splitlines()[3:-1]]
    assert printed == ["Raw Confidence", "HRE", "NWKR", "HRE"]
