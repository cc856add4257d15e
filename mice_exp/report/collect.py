"""Read the results of finished jobs back from MLflow (and nothing else) for the report.

Each Hydra job is one MLflow run tagged with its ``llm``, ``dataset``, ``features``,
``estimator`` and ``protocol``; its metrics are its own estimator's scores, the reference rows
(``baseline.<key>.<metric>``) and the permutation-test p-values; its ``predictions.csv``
artifact holds every row's test predictions. :func:`collect_runs` keeps the FINISHED runs that
reached the estimation stage, the latest per (llm, dataset, features, estimator, protocol).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from mice_exp.errors import UserError
from mice_exp.tracking.schema import (
    KEY_TAGS,
    OBJECTIVE,
    PARENT_TAG,
    PREDICTIONS,
    REPORT_TAG,
    SWEEP_TAG,
    parse_baseline_key,
    reused_tag,
)
from mice_exp.tracking.sweeps import quote

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient
    from mlflow.entities import Run

logger = logging.getLogger(__name__)

_PAGE = 1000


@dataclass(frozen=True)
class RunRecord:
    """What the report needs from one FINISHED job run."""

    run_id: str
    experiment_id: str
    start_time: int
    llm: str
    dataset: str
    features: str
    estimator: str
    protocol: str
    llm_display: str
    estimator_name: str
    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.llm, self.dataset, self.features, self.estimator, self.protocol)

    def baseline_keys(self) -> list[str]:
        """Estimator keys of the reference rows this run logged (``baseline.<key>.<metric>``)."""
        return sorted({parsed[0] for parsed in map(parse_baseline_key, self.metrics) if parsed})


def experiment_ids(client: MlflowClient, name: str | None) -> list[str]:
    """The id of experiment ``name``, or of every active experiment when ``name`` is None."""
    if name is None:
        return [e.experiment_id for e in client.search_experiments()]
    experiment = client.get_experiment_by_name(name)
    if experiment is None or experiment.lifecycle_stage != "active":
        known = sorted(e.name for e in client.search_experiments())
        raise UserError(f"no MLflow experiment named {name!r}; expected one of {known or '(none)'}")
    return [experiment.experiment_id]


def search_all(client: MlflowClient, ids: Sequence[str], filter_string: str) -> list[Run]:
    """Every matching active run, newest first (all pages)."""
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs(list(ids), filter_string=filter_string, max_results=_PAGE,
                                  order_by=["attributes.start_time DESC"], page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def finished_filter(sweep: str | None = None) -> str:
    parts = ["attributes.status = 'FINISHED'"]
    if sweep is not None:
        parts.append(f"tags.{SWEEP_TAG} = {quote(sweep, 'sweep')}")
    return " and ".join(parts)


def sweep_runs(client: MlflowClient, ids: Sequence[str], sweep: str | None) -> list[Run]:
    """FINISHED runs of a sweep, newest first: its own jobs' runs and the identical earlier runs
    its skipped jobs reused (so a preset whose jobs another sweep already ran still has them all)."""
    runs = search_all(client, ids, finished_filter(sweep))
    if sweep is not None:
        reused = search_all(client, ids, f"attributes.status = 'FINISHED' and tags.`{reused_tag(sweep)}` = 'true'")
        known = {run.info.run_id for run in runs}
        runs += [run for run in reused if run.info.run_id not in known]
        runs.sort(key=lambda run: (run.info.start_time or 0, run.info.run_id), reverse=True)
    return runs


def to_record(run: Run) -> RunRecord | None:
    """A :class:`RunRecord`, or None for runs that are not estimation jobs (parents, reports, stage=llm)."""
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    if tags.get(PARENT_TAG) == "true" or tags.get(REPORT_TAG) == "true" or OBJECTIVE not in metrics:
        return None
    key = {tag: tags.get(tag) or params.get(param) for tag, param in KEY_TAGS.items()}
    if not all(key.values()):
        return None
    return RunRecord(
        run_id=run.info.run_id,
        experiment_id=run.info.experiment_id,
        start_time=int(run.info.start_time or 0),
        llm_display=params.get("llm.display") or key["llm"],
        estimator_name=params.get("estimator.name") or key["estimator"],
        metrics=dict(metrics),
        tags=dict(tags),
        **key,
    )


def latest_per_key(records: Iterable[RunRecord]) -> list[RunRecord]:
    """The newest record of each (llm, dataset, features, estimator, protocol), in first-seen order."""
    best: dict[tuple, RunRecord] = {}
    for record in records:
        kept = best.get(record.key)
        if kept is None or (record.start_time, record.run_id) > (kept.start_time, kept.run_id):
            best[record.key] = record
    return list(best.values())


def known_sweeps(client: MlflowClient, ids: Sequence[str], limit: int = 10) -> list[str]:
    """The sweep tags of the most recent runs (for error messages)."""
    seen: list[str] = []
    for run in client.search_runs(list(ids), max_results=500, order_by=["attributes.start_time DESC"]):
        value = run.data.tags.get(SWEEP_TAG)
        if value and value not in seen:
            seen.append(value)
        if len(seen) >= limit:
            break
    return seen


def collect_runs(client: MlflowClient, ids: Sequence[str], sweep: str | None = None,
                 label: str | None = None) -> list[RunRecord]:
    """FINISHED estimation runs of the experiments ``ids`` (of one sweep), latest per key.

    ``label`` names the experiments in the error raised when there is none.
    """
    if sweep is not None:
        sweep = sweep.rstrip("/") or sweep
    records = [r for r in (to_record(run) for run in sweep_runs(client, ids, sweep)) if r]
    if not records:
        where = label or f"experiment id(s) {', '.join(ids) or '(none)'}"
        where += f" with tag sweep={sweep!r}" if sweep else ""
        hint = ""
        if sweep is not None:
            sweeps = known_sweeps(client, ids)
            hint = f"; recent sweeps: {', '.join(sweeps)}" if sweeps else "; no run has a sweep tag"
        raise UserError(f"no FINISHED run with estimation metrics in {where}{hint}")
    return latest_per_key(records)


@contextmanager
def _quiet_downloads() -> Iterator[None]:
    """No per-file progress bar from MLflow while the report downloads predictions."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


class Predictions:
    """One CSV artifact of runs (default ``predictions.csv``), downloaded through MLflow once each
    (None when missing)."""

    def __init__(self, client: MlflowClient, artifact: str = PREDICTIONS):
        self.client = client
        self.artifact = artifact
        self._cache: dict[str, pd.DataFrame | None] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="mice_exp_report_")

    def __call__(self, run_id: str) -> pd.DataFrame | None:
        if run_id not in self._cache:
            self._cache[run_id] = self._load(run_id)
        return self._cache[run_id]

    def _load(self, run_id: str) -> pd.DataFrame | None:
        target = Path(self._tmp.name) / run_id
        target.mkdir(parents=True, exist_ok=True)
        try:
            with _quiet_downloads():
                path = self.client.download_artifacts(run_id, self.artifact, str(target))
        except Exception as error:  # noqa: BLE001 - a missing artifact leaves the curve out
            logger.warning("run %s: no %s artifact (%s)", run_id, self.artifact, str(error).splitlines()[0][:200])
            return None
        return pd.read_csv(path)

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> Predictions:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
