"""Where runs go: the tracking URI, the artifact location, and a client opened once per process.

``tracking.uri: null`` means the embedded SQLite store ``sqlite:///<root>/mlruns/mlflow.db`` with
artifacts in ``<root>/mlruns/artifacts``; any other value is handed to MLflow (a server URL such
as ``http://host:5000``, ``sqlite:///other.db`` (relative to the project root),
``postgresql://...``).

Two MLflow behaviours shape this module:

* The first client to open an empty SQLite file runs every schema migration (seconds). Processes
  that start together (a Hydra multirun) race on it and fail with ``duplicate column`` or
  ``database is locked``. The first open of an embedded store therefore happens under a file lock
  next to the database, and a marker file records that the schema is ready so later processes
  skip the lock. :func:`ensure_experiment` does all this once, before the jobs start (the Hydra
  callback in :mod:`mice_exp.tracking.hydra_callback` calls it when a multirun starts).
* ``create_experiment`` is not idempotent: a second creator gets ``RESOURCE_ALREADY_EXISTS``.
  :func:`get_or_create_experiment` treats that as success and reads the winner's id.

MLflow is imported only here and only when tracking is enabled, since importing it costs seconds.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from filelock import FileLock

from mice_exp.cache import unwritable
from mice_exp.errors import UserError
from mice_exp.tracking.dashboard import ensure_runs_view

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

logger = logging.getLogger(__name__)

STORE_DIR = "mlruns"
DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "artifacts"
LOCK_TIMEOUT_S = 600.0
_SERVER_SCHEMES = ("http://", "https://", "databricks")
#: The stores MLflow can open (a dialect suffix such as postgresql+psycopg2 is allowed).
SCHEMES = ("sqlite", "http", "https", "file", "databricks", "postgresql", "mysql", "mssql")

CONNECT_TIMEOUT_S = 5.0

_clients: dict[str, MlflowClient] = {}
_experiments: dict[tuple[str, str], str] = {}
_guard = threading.Lock()


def tracking_section(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``tracking`` group, whether given the group itself or the whole job config."""
    if cfg is None:
        return {}
    if "tracking" in cfg and not any(k in cfg for k in ("uri", "experiment", "enabled")):
        return cfg["tracking"] or {}
    return cfg


def is_enabled(cfg: Mapping[str, Any]) -> bool:
    return bool(tracking_section(cfg).get("enabled", True))


def experiment_name(cfg: Mapping[str, Any]) -> str:
    name = tracking_section(cfg).get("experiment") or "mice_exp"
    return str(name)


def tracking_uri(cfg: Mapping[str, Any], root: Path) -> str:
    """The MLflow tracking URI for ``cfg`` (the tracking group or the whole config)."""
    uri = tracking_section(cfg).get("uri")
    root = Path(root).resolve()
    if uri is None or str(uri).strip() == "":
        return "sqlite:///" + (root / STORE_DIR / DB_NAME).as_posix()
    uri = str(uri).strip()
    if uri.startswith("sqlite:///"):
        rest = uri[len("sqlite:///") :]
        path, sep, query = rest.partition("?")
        if path and not path.startswith("/") and not path.startswith(":memory:"):
            path = (root / unquote(path)).resolve().as_posix()  # relative to the project, not the cwd
        return "sqlite:///" + path + sep + query
    if "://" not in uri and not uri.startswith(("file:", "databricks")):
        raise UserError(
            f"tracking.uri={uri!r} has no scheme; expected null (the embedded SQLite store under "
            f"<root>/{STORE_DIR}), sqlite:///path/to/mlflow.db, or a server URL such as http://host:5000"
        )
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme not in SCHEMES:
        raise UserError(f"tracking.uri={uri!r}: unknown scheme {scheme!r}; expected one of "
                        f"{', '.join(SCHEMES)} (or null for the embedded store)")
    return uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for anything else, in-memory included)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = unquote(uri[len("sqlite:///") :].partition("?")[0])
    if not path or path.startswith(":memory:"):
        return None
    return Path(path)


def artifact_location(cfg: Mapping[str, Any], root: Path) -> str | None:
    """Where a *new* experiment keeps its artifacts (None: the server decides).

    ``tracking.artifact_location`` wins when set (a local path is taken relative to the project
    root). Otherwise a SQLite store keeps them in ``artifacts/`` next to its database, a server
    chooses itself, and any other database gets ``<root>/mlruns/artifacts``. MLflow's own
    default would be ``./mlruns`` in the working directory, which a Hydra job must not write to.
    """
    section = tracking_section(cfg)
    explicit = section.get("artifact_location")
    root = Path(root).resolve()
    if explicit:
        explicit = str(explicit)
        if "://" in explicit or explicit.startswith("file:"):
            return explicit
        path = Path(explicit).expanduser()
        return (path if path.is_absolute() else root / path).resolve().as_uri()
    uri = tracking_uri(section, root)
    if uri.startswith(_SERVER_SCHEMES) or uri.startswith("file:"):
        return None
    db = sqlite_path(uri)
    base = db.parent if db is not None else root / STORE_DIR
    return (base / ARTIFACTS_DIR).as_uri()


def _ready_marker(db: Path) -> Path:
    return db.with_name(db.name + ".ready")


def _mlflow_version() -> str:
    import mlflow

    return mlflow.__version__


def _new_client(uri: str) -> MlflowClient:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        client = MlflowClient(tracking_uri=uri)  # builds the store: migrations, schema check
    except MlflowException as error:
        if "out-of-date database schema" in str(error):
            raise UserError(
                f"the MLflow store {uri} was written by an older MLflow; back it up and run "
                f"`mlflow db upgrade {uri}` (or point tracking.uri elsewhere)"
            ) from error
        raise
    return client


class TrackingUnavailable(UserError):
    """The store cannot be written or reached: a run goes on untracked and says so at its end."""


def check_reachable(uri: str) -> None:
    """Fail in seconds on a read-only SQLite folder or a server that does not answer (MLflow would
    retry for minutes, or write half a run)."""
    db = sqlite_path(uri)
    if db is not None:
        problem = unwritable(db.parent) or (db.exists() and not os.access(db, os.W_OK) and f"{db} is read-only")
        if problem:
            raise TrackingUnavailable(f"the MLflow store {db.parent} is not writable ({problem}); expected a writable "
                                      "folder: make it writable, point tracking.uri elsewhere or pass "
                                      "tracking.enabled=false")
    elif uri.startswith(("http://", "https://")):
        parts = urlsplit(uri)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as error:
            raise TrackingUnavailable(f"tracking.uri={uri}: no MLflow server answers ({error.strerror or error}); "
                                      "expected a running server, or tracking.enabled=false") from None


def open_client(uri: str) -> MlflowClient:
    """A client for ``uri``, opened once per process (migrating an empty SQLite file safely)."""
    with _guard:
        if uri in _clients:
            return _clients[uri]
    check_reachable(uri)
    db = sqlite_path(uri)
    start = time.perf_counter()
    if db is None:
        client = _new_client(uri)
    else:
        db.parent.mkdir(parents=True, exist_ok=True)
        marker = _ready_marker(db)
        version = _mlflow_version()
        ready = db.is_file() and db.stat().st_size > 0 and marker.is_file() and marker.read_text() == version
        if ready:
            client = _new_client(uri)
        else:
            with FileLock(str(db) + ".lock", timeout=LOCK_TIMEOUT_S):
                client = _new_client(uri)  # creates the tables, or waits for the creator
                marker.write_text(version)
    logger.debug("opened MLflow store %s in %.2fs", uri, time.perf_counter() - start)
    with _guard:
        return _clients.setdefault(uri, client)


def get_or_create_experiment(client: MlflowClient, name: str, location: str | None) -> str:
    """The id of experiment ``name``, created (with ``location``) when missing.

    Tolerates a concurrent creator, and restores the experiment if it was deleted (MLflow keeps
    deleted experiments' names reserved, so creating it again would fail).
    """
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, artifact_location=location)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        logger.warning("MLflow experiment %r was deleted; restoring it to log new runs", name)
        client.restore_experiment(experiment.experiment_id)
    return experiment.experiment_id


def experiment_id(client: MlflowClient, uri: str, name: str, location: str | None) -> str:
    """:func:`get_or_create_experiment`, remembered per process; under the store's lock for SQLite.
    The experiment gets the UI's Table-1 runs view (:mod:`mice_exp.tracking.dashboard`)."""
    key = (uri, name)
    with _guard:
        if key in _experiments:
            return _experiments[key]
    experiment = client.get_experiment_by_name(name)
    if experiment is not None and experiment.lifecycle_stage == "active":
        found = experiment.experiment_id
    else:
        db = sqlite_path(uri)
        if db is None:
            found = get_or_create_experiment(client, name, location)
        else:
            with FileLock(str(db) + ".lock", timeout=LOCK_TIMEOUT_S):
                found = get_or_create_experiment(client, name, location)
    ensure_runs_view(client, found)  # writes only when the tags are missing (a new or older experiment)
    with _guard:
        return _experiments.setdefault(key, found)


def ensure_experiment(cfg: Mapping[str, Any], root: Path) -> str | None:
    """Open the store and get or create the experiment now; returns its id (None if disabled).

    Call it once before launching parallel jobs so that none of them pays for, or races on,
    the schema migration and the experiment's creation.
    """
    if not is_enabled(cfg):
        return None
    uri = tracking_uri(cfg, root)
    client = open_client(uri)
    return experiment_id(client, uri, experiment_name(cfg), artifact_location(cfg, root))

