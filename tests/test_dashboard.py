"""The MLflow UI opens on the runs table with the Table-1 metrics: links, run names, experiment tags."""

from __future__ import annotations

import json

from mice_exp.compose import as_plain, compose_config
from mice_exp.tracking import ensure_experiment, schema, tracked_run, tracking_uri
from mice_exp.tracking.dashboard import (
    KIND_TAG,
    ML_KIND,
    VIEW_KEY,
    VIEW_TAG,
    experiment_link,
    run_link,
    run_name,
    view_state,
)
from mice_exp.tracking.store import open_client

CFG = {"uri": None, "experiment": "mice_exp_dashboard", "enabled": True}


def test_links_open_the_runs_table_of_the_local_ui_or_of_the_tracking_server() -> None:
    assert experiment_link("sqlite:////p/mlruns/mlflow.db", "3") == (
        "http://127.0.0.1:5000/#/experiments/3/runs?viewStateShareKey=mice_exp_table1&workflowType=machine_learning")
    assert run_link("http://host:5000/", "3", "abc") == (
        "http://host:5000/#/experiments/3/runs/abc?workflowType=machine_learning")


def test_a_run_is_named_by_what_it_is() -> None:
    tags = {"llm": "smollm2_135m", "features": "bertscore", "estimator": "mice_rf", "protocol": "holdout",
            "risk": "medium", "dataset": "ste"}
    assert run_name(tags) == "smollm2_135m|bertscore|mice_rf|holdout|medium"  # tags written before the selection
    assert run_name(tags | {"selection": "all"}) == "smollm2_135m|bertscore|mice_rf|holdout|medium|all"


def test_runs_on_45_and_on_750_calls_get_different_names() -> None:
    """make run (dataset.max_apis=3: 12 test calls) and the full data set (200) are told apart at a glance."""
    def name(*overrides: str) -> str:
        return run_name(schema.job_tags(as_plain(compose_config(list(overrides)))))

    assert name("dataset.max_apis=3") == "smollm2_135m|bertscore|mice_rf|holdout|medium|max_apis=3"
    assert name() == "smollm2_135m|bertscore|mice_rf|holdout|medium|all"
    assert name("dataset=bfcl", "dataset.apis=[live_simple]", "dataset.max_per_api=20").endswith(
        "|apis=[live_simple],max_per_api=20")


def test_the_saved_view_puts_table_1_metrics_first_best_auc_on_top() -> None:
    view = view_state()
    assert view["selectedColumns"][:5] == ["metrics.`smece`", "metrics.`etcu_low`", "metrics.`etcu_medium`",
                                           "metrics.`etcu_high`", "metrics.`auc_etcu`"]
    assert view["columnOrder"][0] == "attributes.`Run Name`" and view["columnOrder"][1:] == view["selectedColumns"]
    assert (view["orderByKey"], view["orderByAsc"]) == ("metrics.`auc_etcu`", False)


def test_the_runs_table_ranks_runs_within_their_test_set_size() -> None:
    """One group per selection, so a 12-test-call run's lucky AUC-ETCU never sits above a 200-call run's:
    best AUC-ETCU on top within each group, the selection also a column."""
    view = view_state()
    assert view["groupBy"] == {"aggregateFunction": "max", "groupByKeys": [{"mode": "tag", "groupByData": "selection"}]}
    assert "tags.`selection`" in view["selectedColumns"]


def test_every_experiment_gets_the_ml_kind_and_the_view_and_every_run_prints_its_links(tmp_path, capsys) -> None:
    experiment = ensure_experiment(CFG, tmp_path)
    client = open_client(tracking_uri(CFG, tmp_path))
    tags = client.get_experiment(experiment).tags
    assert tags[KIND_TAG] == ML_KIND and json.loads(tags[VIEW_TAG]) == view_state()
    assert VIEW_TAG.endswith(VIEW_KEY)
    with tracked_run(CFG, tmp_path, run_name="a|b") as run:
        pass
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"MLflow run a|b: http://127.0.0.1:5000/#/experiments/{experiment}/runs/{run.run_id}" \
                         "?workflowType=machine_learning"
    assert printed[1].endswith(f"/#/experiments/{experiment}/runs?viewStateShareKey={VIEW_KEY}"
                               "&workflowType=machine_learning")
