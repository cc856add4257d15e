"""The MLflow UI on the runs table, with the Table-1 metrics as its first columns.

MLflow 3.x opens an experiment on its GenAI "Overview" page and shows no metric column in the
runs table until someone picks them. Two experiment tags fix both for everyone who opens the
links printed here (read from MLflow 3.17's UI code, ``mlflow/server/js/build``):

* ``mlflow.experimentKind = custom_model_development``: a classic ML experiment, so the UI's
  "Machine learning" view; the links also carry ``workflowType=machine_learning``, which picks
  that view whatever the tag says;
* ``mlflow.sharedViewState.<key>``: a saved view (what the UI's "Share" button stores) that the
  link names with ``viewStateShareKey=<key>``: the selected columns and the sort order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from mice_exp.tracking.schema import SELECTION_TAG

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

#: Where ``make ui`` serves the project's SQLite store.
LOCAL_UI = "http://127.0.0.1:5000"
KIND_TAG, ML_KIND = "mlflow.experimentKind", "custom_model_development"
VIEW_KEY = "mice_exp_table1"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
#: The tags that say what a run is: its name joins them, its columns show them; the last, which calls it ran on
#: (``all``, ``max_apis=3``), also groups the runs table.
TAG_COLUMNS = ("llm", "features", "estimator", "protocol", "risk", SELECTION_TAG)


def run_name(tags: Mapping[str, str]) -> str:
    """``smollm2_135m|bertscore|mice_rf|holdout|medium|all``: what the run is, readable in the runs table; 45 and 750
    calls differ in the last part (``max_apis=3`` / ``all``), absent from tags written without it."""
    return "|".join(str(tags[key]) for key in TAG_COLUMNS if key != SELECTION_TAG or key in tags)


RUN_NAME_COLUMN = "attributes.`Run Name`"


def view_state(metrics: Sequence[str] | None = None, tags: Sequence[str] = TAG_COLUMNS) -> dict:
    """The saved view: metric columns (default: the tables' metrics, MICE Table 1's then selective
    prediction's) in that order (the UI sorts them alphabetically otherwise), then the describing tags;
    the run name wide enough to read; one group of runs per selection (``all``, ``max_apis=3``: a 12-test-call
    run's AUC-ETCU is noise beside a 200-call one's), expanded, best AUC-ETCU on top of each. The UI orders
    the groups by their best AUC-ETCU (``max``); runs without the tag (older ones, sweep and report runs) sit in
    its collapsed group of the remaining runs."""
    from mice_exp.metrics.registry import METRICS  # numpy and scikit-learn: not with every import of tracking

    columns = [f"metrics.`{m}`" for m in metrics or METRICS] + [f"tags.`{t}`" for t in tags]
    widths = {RUN_NAME_COLUMN: 330} | {column: 96 for column in columns}
    group = {"aggregateFunction": "max", "groupByKeys": [{"mode": "tag", "groupByData": SELECTION_TAG}]}
    return {"selectedColumns": columns, "columnOrder": [RUN_NAME_COLUMN, *columns], "columnWidths": widths,
            "groupBy": group, "orderByKey": "metrics.`auc_etcu`", "orderByAsc": False}


def ensure_runs_view(client: MlflowClient, experiment_id: str) -> None:
    """Tag the experiment as classic ML and save the Table-1 view (only what is missing or changed)."""
    tags = client.get_experiment(experiment_id).tags
    wanted = {KIND_TAG: ML_KIND, VIEW_TAG: json.dumps(view_state())}
    for key, value in wanted.items():
        if tags.get(key) != value:
            client.set_experiment_tag(experiment_id, key, value)


def ui_base(tracking_uri: str) -> str:
    """The UI of a tracking server is the server itself; a local store is what ``make ui`` serves."""
    return tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else LOCAL_UI


def experiment_link(tracking_uri: str, experiment_id: str) -> str:
    """The experiment's runs table in the Table-1 view (the runs route itself: opening the experiment's
    root redirects to a tab and keeps only time and workflow parameters, dropping the view key)."""
    query = urlencode({"viewStateShareKey": VIEW_KEY, "workflowType": "machine_learning"})
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs?{query}"


def run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """One run's page (its metrics, params, figures)."""
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"
