"""A sweep's parent run (where its report goes) and skipping jobs that already FINISHED.

* :func:`ensure_parent_run` is called once by the launching process of a multirun: it creates
  (or finds again, when a sweep folder is reused) a run tagged ``sweep=<sweep id>`` and
  ``sweep_parent=true`` holding the sweep's overrides. ``mice-exp report --sweep ID`` logs the
  tables and figures to it.
* :func:`config_hash` is a digest of a job's resolved config; a job tags its run with it
  (``config_hash``) and :func:`finished_run_with_config` finds a FINISHED run with the same
  digest, so a re-launched sweep can skip the jobs that are already done.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from mice_exp.cache import stable_hash
from mice_exp.errors import UserError
from mice_exp.tracking.gitinfo import git_tags
from mice_exp.tracking.params import MAX_TAG_VALUE_LENGTH, flatten_params, truncate
from mice_exp.tracking.schema import CONFIG_HASH_TAG, OVERRIDES_TAG, PARENT_TAG, SWEEP_TAG, reused_tag
from mice_exp.tracking.store import (
    LOCK_TIMEOUT_S,
    artifact_location,
    experiment_id,
    experiment_name,
    is_enabled,
    open_client,
    sqlite_path,
    tracking_section,
    tracking_uri,
)

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

#: Config keys (top-level, or dotted) that say where things are stored or how many processes compute them, not
#: what is computed (the permutation tests' p-values are the same for any n_jobs, the LLM stage's records for
#: any llm.shards).
HASH_IGNORES = ("tracking", "paths", "hydra", "force", "n_jobs", "llm.shards", "llm.shard")


def quote(value: str, what: str) -> str:
    """``value`` as a quoted MLflow filter literal (a quote inside cannot be escaped there)."""
    if "'" in value:
        raise UserError(f"{what} {value!r} contains a single quote; MLflow filters cannot search for it")
    return f"'{value}'"


def config_hash(cfg: Mapping[str, Any], ignore: Sequence[str] = HASH_IGNORES) -> str:
    """A digest of the resolved job config, leaving out the top-level groups and dotted keys in ``ignore``.

    Computed on the flattened params (the values MLflow records), so it depends only on
    content, not on key order. The code version is not part of it: add
    ``{"git": commit}`` to ``cfg`` to make a new commit re-run everything.
    """
    skip = set(ignore)
    params = flatten_params({k: v for k, v in cfg.items() if k not in skip})
    return stable_hash({k: v for k, v in params.items() if k not in skip}, length=32)


def finished_run_with_config(client: MlflowClient, experiment_id: str, config_hash: str) -> str | None:
    """The newest FINISHED run of ``experiment_id`` tagged ``config_hash=<config_hash>``, or None."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.{CONFIG_HASH_TAG} = {quote(config_hash, 'config hash')} "
        "and attributes.status = 'FINISHED'",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return runs[0].info.run_id if runs else None


def mark_reused(client: MlflowClient, run_id: str, sweep_id: str) -> None:
    """Record that a job of ``sweep_id`` skipped itself because ``run_id`` already has its result."""
    client.set_tag(run_id, reused_tag(sweep_id), "true")


def find_parent_run(client: MlflowClient, experiment_ids: Sequence[str], sweep_id: str) -> str | None:
    """The parent run of sweep ``sweep_id`` (tags ``sweep_parent=true``, ``sweep=<id>``), or None."""
    runs = client.search_runs(
        list(experiment_ids),
        filter_string=f"tags.{PARENT_TAG} = 'true' and tags.{SWEEP_TAG} = {quote(sweep_id, 'sweep')}",
        max_results=1,
        order_by=["attributes.start_time ASC"],  # the first one created, should two ever exist
    )
    return runs[0].info.run_id if runs else None


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    db = sqlite_path(uri)
    if db is None:
        yield
        return

    with FileLock(str(db) + ".lock", timeout=LOCK_TIMEOUT_S):
        yield


def ensure_parent_run(
    tracking_cfg: Mapping[str, Any], root: Path, sweep_id: str, overrides: Sequence[str] = ()
) -> str | None:
    """The id of sweep ``sweep_id``'s parent run, created if missing (None if tracking is off).

    ``sweep_id`` must be the value the jobs tag as ``sweep`` (``hydra.sweep.dir`` as written in
    the config, see :func:`mice_exp.tracking.hydra_tags`). The run records the overrides as the
    ``sweep.overrides`` tag and a ``sweep.yaml`` artifact, and is ended FINISHED at once: it
    holds no job, only the sweep's description and, later, its report (logging to a finished
    run is allowed), so a crashed launcher never leaves it RUNNING.
    """
    section = tracking_section(tracking_cfg)
    if not is_enabled(section):
        return None
    root = Path(root).resolve()
    uri = tracking_uri(section, root)
    client = open_client(uri)
    exp_id = experiment_id(client, uri, experiment_name(section), artifact_location(section, root))
    overrides = [str(o) for o in overrides]
    with _store_lock(uri):
        found = find_parent_run(client, [exp_id], sweep_id)
        if found is not None:
            return found
        tags = {
            "mlflow.source.name": "mice_exp",
            SWEEP_TAG: sweep_id,
            PARENT_TAG: "true",
            OVERRIDES_TAG: truncate(" ".join(overrides), MAX_TAG_VALUE_LENGTH),
            **git_tags(root),
        }
        run = client.create_run(exp_id, run_name=f"sweep {sweep_id}", tags=tags)
        run_id = run.info.run_id
        try:
            client.log_dict(run_id, {"sweep": sweep_id, "overrides": overrides}, "sweep.yaml")
        finally:
            client.set_terminated(run_id, "FINISHED")
    return run_id
