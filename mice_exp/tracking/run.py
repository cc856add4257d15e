"""One MLflow run per Hydra job: ``with tracked_run(...) as run: run.log_metrics(...)``.

The run is created with the job's resolved config as flattened params (and the whole config as
``config.yaml``), the git commit and dirty flag, and the caller's tags. However the block ends,
the run ends: FINISHED, or FAILED with an ``error`` tag and an ``error.txt`` traceback (KILLED on
Ctrl-C), and the exception still propagates. SIGTERM (Slurm's ``scancel``, a pool worker stopped,
``kill``) ends it too: KILLED, or FAILED when Slurm says the job reached its time limit (see
:class:`Terminated`). ``tracking.enabled: false`` gives a :class:`NullRun` with the same methods
that records nothing and never imports MLflow.

Everything goes through an explicit ``MlflowClient`` rather than MLflow's fluent API (no global
active run, no ``mlflow.set_tracking_uri``), so a reused worker process or a test cannot leak a
run or a tracking URI into the next job.
"""

from __future__ import annotations

import getpass
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mice_exp.tracking.dashboard import experiment_link, run_link
from mice_exp.tracking.gitinfo import git_tags
from mice_exp.tracking.params import (
    MAX_PARAMS_PER_BATCH,
    MAX_TAG_VALUE_LENGTH,
    flatten_metrics,
    flatten_params,
    sanitize_key,
    truncate,
)
from mice_exp.errors import Terminated, UserError
from mice_exp.jsonable import jsonable
from mice_exp.tracking.schema import SWEEP_TAG
from mice_exp.tracking.store import (
    TrackingUnavailable,
    artifact_location,
    experiment_id,
    experiment_name,
    is_enabled,
    open_client,
    tracking_section,
    tracking_uri,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.figure import Figure
    from mlflow import MlflowClient

logger = logging.getLogger(__name__)

MAX_METRICS_PER_BATCH = 1000
TABLE_FORMATS = (".csv", ".parquet")


def _write_table(df: pd.DataFrame, artifact_file: str, directory: Path) -> Path:
    suffix = Path(artifact_file).suffix.lower()
    if suffix not in TABLE_FORMATS:
        raise ValueError(f"log_table: {artifact_file!r} must end in .csv or .parquet")
    keep_index = not (df.index.name is None and type(df.index).__name__ == "RangeIndex")
    path = directory / Path(artifact_file).name
    if suffix == ".csv":
        df.to_csv(path, index=keep_index)
    else:
        df.to_parquet(path, index=keep_index)
    return path


class NullRun:
    """The tracker for ``tracking.enabled: false``: same interface, records nothing."""

    enabled = False
    run_id: str | None = None
    experiment_id: str | None = None
    artifact_uri: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> dict[str, str]:
        return flatten_params(params)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> dict[str, float]:
        return flatten_metrics(metrics)[0]

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def log_dict(self, dictionary: Mapping[str, Any], artifact_file: str) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass

    def log_figure(self, figure: Figure, artifact_file: str, **save_kwargs: Any) -> None:
        pass

    def log_table(self, df: pd.DataFrame, artifact_file: str) -> None:
        if Path(artifact_file).suffix.lower() not in TABLE_FORMATS:
            raise ValueError(f"log_table: {artifact_file!r} must end in .csv or .parquet")

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if not Path(path).exists():
            raise FileNotFoundError(path)


class TrackedRun:
    """An open MLflow run; made by :func:`tracked_run`, which also ends it."""

    enabled = True

    def __init__(self, client: MlflowClient, run_id: str, experiment_id: str, artifact_uri: str):
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.artifact_uri = artifact_uri
        self._params: dict[str, str] = {}

    def log_params(self, params: Mapping[str, Any]) -> dict[str, str]:
        """Flatten and log ``params``; a key already logged is skipped if its value is the same.

        MLflow params are immutable, so a key logged again with another value is a ValueError
        (raised before anything is sent, so the run's params stay consistent).
        """
        from mlflow.entities import Param

        flat = flatten_params(params)
        clashes = {k: (self._params[k], v) for k, v in flat.items() if k in self._params and self._params[k] != v}
        if clashes:
            key, (old, new) = next(iter(clashes.items()))
            raise ValueError(
                f"param {key!r} was already logged as {old[:80]!r}; MLflow params are immutable "
                f"(new value {new[:80]!r}; {len(clashes)} clashing key(s))"
            )
        fresh = [Param(k, v) for k, v in flat.items() if k not in self._params]
        for start in range(0, len(fresh), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=fresh[start : start + MAX_PARAMS_PER_BATCH])
        self._params.update(flat)
        return flat

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> dict[str, float]:
        """Log numeric values (nested dicts become dotted keys); others are skipped with a warning."""
        from mlflow.entities import Metric

        values, skipped = flatten_metrics(metrics)
        if skipped:
            logger.warning("not logged as MLflow metrics (not numbers): %s", ", ".join(skipped))
        now = int(time.time() * 1000)
        entries = [Metric(k, v, now, step or 0) for k, v in values.items()]
        for start in range(0, len(entries), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=entries[start : start + MAX_METRICS_PER_BATCH])
        return values

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags (mutable, unlike params); None values are skipped."""
        from mlflow.entities import RunTag

        entries = [
            RunTag(sanitize_key(str(k)), truncate(str(v), MAX_TAG_VALUE_LENGTH))
            for k, v in tags.items()
            if v is not None
        ]
        for start in range(0, len(entries), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=entries[start : start + MAX_PARAMS_PER_BATCH])

    def log_dict(self, dictionary: Mapping[str, Any], artifact_file: str) -> None:
        """JSON, or YAML when ``artifact_file`` ends in .yaml / .yml."""
        self.client.log_dict(self.run_id, jsonable(dictionary), artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_figure(self, figure: Figure, artifact_file: str, **save_kwargs: Any) -> None:
        """Save a matplotlib figure (PNG/PDF/SVG by extension; dpi 150, tight box by default)."""
        kwargs = {"dpi": 150, "bbox_inches": "tight", **save_kwargs}
        self.client.log_figure(self.run_id, figure, artifact_file, save_kwargs=kwargs)

    def log_table(self, df: pd.DataFrame, artifact_file: str) -> None:
        """A DataFrame as ``.csv`` or ``.parquet`` (chosen by the extension of ``artifact_file``)."""
        folder = str(Path(artifact_file).parent.as_posix())
        with tempfile.TemporaryDirectory() as tmp:
            path = _write_table(df, artifact_file, Path(tmp))
            self.client.log_artifact(self.run_id, str(path), None if folder in ("", ".") else folder)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Copy a file (or a whole folder) into the run's artifacts, under ``artifact_path``."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(path)
        self.client.log_artifact(self.run_id, str(path), artifact_path)


def hydra_tags() -> dict[str, str]:
    """Tags describing the current Hydra job ({} outside Hydra): sweep id, job number, overrides."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return {}
        hc = HydraConfig.get()
        tags = {"hydra.output_dir": str(hc.runtime.output_dir)}
        if str(hc.mode) == "RunMode.MULTIRUN":
            tags[SWEEP_TAG] = str(hc.sweep.dir)
            tags["hydra.job_num"] = str(hc.job.num)
        if hc.job.override_dirname:
            tags["hydra.overrides"] = str(hc.job.override_dirname)
        return tags
    except Exception:  # noqa: BLE001 - tags are best effort
        return {}


def _base_tags(root: Path) -> dict[str, str]:
    tags = {"mlflow.source.name": "mice_exp", **git_tags(root)}
    try:
        tags["mlflow.user"] = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        pass
    return tags


def slurm_end_reason(job_id: str | None = None, timeout_s: float = 5.0) -> str | None:
    """Why Slurm is ending job ``job_id`` (default ``$SLURM_JOB_ID``): squeue's reason, e.g. ``TimeLimit``
    at the time limit and ``None`` after scancel; None outside Slurm or when squeue does not answer."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%r"], capture_output=True, text=True,
                              timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None


def _terminated() -> Terminated:
    reason = slurm_end_reason()
    if reason == "TimeLimit":
        return Terminated("FAILED", "SIGTERM: the Slurm job reached its time limit (hydra.launcher.timeout_min)")
    if reason is not None:
        return Terminated("KILLED", f"SIGTERM: the Slurm job was cancelled (scancel; squeue reason {reason})")
    return Terminated("KILLED", "SIGTERM: the job was stopped (kill, scancel or its pool shutting down)")


class _SigtermRaises:
    """While active, the first SIGTERM raises :class:`Terminated`; once :meth:`ending` is called (the run
    is being ended) or after the first, SIGTERM is only logged, so the run's end is never cut short.
    :meth:`restore` puts the previous handler back.

    Submitit's job runner bypasses SIGTERM (it only logs it) and checkpoints / requeues on its USR2,
    sent ``signal_delay_s`` before the time limit; that handler is left alone. Signal handlers can only
    be set in the main thread: elsewhere nothing is installed.
    """

    def __init__(self) -> None:
        self.armed = threading.current_thread() is threading.main_thread()
        self.previous: Any = None
        if self.armed:
            self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.armed:
            logger.warning("SIGTERM while the MLflow run ends: it ends first")
            return
        self.armed = False
        raise _terminated()

    def ending(self) -> None:
        self.armed = False

    def restore(self) -> None:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self.previous if self.previous is not None else signal.SIG_DFL)


def _end_status(error: BaseException) -> str:
    if isinstance(error, Terminated):
        return error.status
    if isinstance(error, KeyboardInterrupt):
        return "KILLED"
    if isinstance(error, SystemExit) and error.code in (None, 0):
        return "FINISHED"
    return "FAILED"


def _error_text(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return f"SystemExit({error.code!r})"
    message = str(error).strip()
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


@contextmanager
def tracked_run(
    tracking_cfg: Mapping[str, Any],
    root: Path,
    run_name: str | None = None,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
) -> Iterator[TrackedRun | NullRun]:
    """Open one MLflow run for a job, yield its tracker, and always end it.

    Args:
        tracking_cfg: the ``tracking`` config group (``uri``, ``experiment``, ``enabled``,
            optional ``artifact_location``); the whole job config also works.
        root: the project root (absolute); the embedded store lives in ``root/mlruns``.
        run_name: shown in the MLflow UI (need not be unique).
        params: the resolved, nested job config; logged flattened as params and whole as
            ``config.yaml``.
        tags: caller tags (llm, dataset, features, estimator, sweep, ...); None values skipped.
    """
    section = tracking_section(tracking_cfg)
    if not is_enabled(section):
        yield NullRun()
        return
    root = Path(root).resolve()
    uri = tracking_uri(section, root)
    try:
        raw = open_client(uri)
        exp_id = experiment_id(raw, uri, experiment_name(section), artifact_location(section, root))
        run_tags = {**_base_tags(root), **{k: v for k, v in (tags or {}).items() if v is not None}}
        run_tags = {sanitize_key(str(k)): truncate(str(v), MAX_TAG_VALUE_LENGTH) for k, v in run_tags.items()}
        info = raw.create_run(exp_id, run_name=run_name, tags=run_tags).info
        failure = None
    except UserError as error:
        if not isinstance(error, TrackingUnavailable):
            raise
        failure = error
    except Exception as error:  # noqa: BLE001 - whatever the store raised, the job runs untracked
        failure = _unavailable(uri, error)
    if failure is not None:  # the job still runs and prints its results; nothing is logged
        yield NullRun()
        raise UserError(f"{failure}; nothing was logged to MLflow (the results above were computed)")
    client = _Guarded(raw, uri)
    run = TrackedRun(client, info.run_id, exp_id, info.artifact_uri)
    print(f"MLflow run {run_name or info.run_id}: {run_link(uri, exp_id, info.run_id)}\n"
          f"  all runs (make ui): {experiment_link(uri, exp_id)}")
    status = "FINISHED"
    sigterm = _SigtermRaises()  # scancel / kill: the run ends KILLED instead of staying RUNNING
    try:
        if params:
            run.log_params(params)
            run.log_dict(params, "config.yaml")
        yield run
    except TrackingUnavailable as error:
        sigterm.ending()
        status = "FAILED"
        raise UserError(f"{error}; the rest of this run was not logged to MLflow (the results above stand)") from None
    except BaseException as error:
        sigterm.ending()
        status = _end_status(error)
        if status != "FINISHED":
            _record_error(run, error)
        raise
    finally:
        sigterm.ending()
        try:
            client.set_terminated(run.run_id, status)
        except TrackingUnavailable:
            pass  # already reported as the run's error
        except Exception:
            logger.exception("could not end MLflow run %s as %s", run.run_id, status)
            if status == "FINISHED":
                raise  # nothing else is propagating: do not hide that the run was left open
        finally:
            sigterm.restore()


# MLflow's answers about an entity, not failures of the store: the caller decides (a second gate
# registered under one name becomes its next version; a missing run is the user's wrong URI).
ANSWERS = ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST")


class _Guarded:
    """An MlflowClient whose failures (a store gone read-only, a server gone down) become
    :class:`TrackingUnavailable`, so a run reports them in one line instead of a traceback per retry;
    the store's answers (:data:`ANSWERS`) reach the caller unchanged."""

    def __init__(self, client: MlflowClient, uri: str):
        self._client = client
        self._uri = uri

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attribute(*args, **kwargs)
            except UserError:
                raise
            except Exception as error:
                if getattr(error, "error_code", None) in ANSWERS:
                    raise
                raise _unavailable(self._uri, error) from None
        return call


def _unavailable(uri: str, error: Exception) -> TrackingUnavailable:
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return TrackingUnavailable(f"the MLflow store {uri} failed ({type(error).__name__}: {first}); "
                               "expected a writable store or a running server, or tracking.enabled=false")


def _record_error(run: TrackedRun, error: BaseException) -> None:
    """Tag the error and keep its traceback; never let this hide the original exception."""
    try:
        run.set_tags({"error": _error_text(error)})
    except Exception:  # noqa: BLE001
        logger.exception("could not tag MLflow run %s with its error", run.run_id)
    try:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        run.log_text(text, "error.txt")
    except Exception:  # noqa: BLE001
        logger.exception("could not log the traceback of MLflow run %s", run.run_id)
