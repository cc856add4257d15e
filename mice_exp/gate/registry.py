"""Gates in MLflow: logged as the artifact folder ``gate/`` of the run that trained them, and
registered as a model version whose source is that folder.

A registered MLflow *pyfunc* would need a pickled (cloudpickle) python model or a code file MLflow
imports on load; neither fits "loading never runs pickled code", so the registry entry points at the
plain gate folder instead (``runs:/<run id>/gate``) and :class:`mice_exp.gate.Gate` loads it.
Sources understood by :func:`fetch`:

* a local folder;
* ``runs:/<run id>/<path>`` (the folder a run logged);
* ``models:/<name>/<version>`` or ``models:/<name>@<alias>`` (a registered version of one).

Everything goes through an explicit ``MlflowClient`` (see :mod:`mice_exp.tracking`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mice_exp.errors import UserError
from mice_exp.tracking.schema import GATE_ARTIFACT
_RUNS = re.compile(r"^runs:/([^/]+)/(.+?)/?$")
_MODELS = re.compile(r"^models:/([^/@]+)(?:/(\d+|latest)|@([^/]+))/?$")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")


def is_mlflow_uri(source: str) -> bool:
    return str(source).startswith(("runs:/", "models:/"))


def model_name(llm: str, features: str, estimator: str) -> str:
    """Default registered-model name of a pipeline's gate."""
    return _NAME_CHARS.sub("_", f"mice_exp-gate-{llm}-{features}-{estimator}")


def log_gate(client: Any, run_id: str, folder: str | Path, artifact_path: str = GATE_ARTIFACT) -> str:
    """Copy a gate folder into a run's artifacts; return its ``runs:/`` URI."""
    client.log_artifacts(run_id, str(folder), artifact_path)
    return f"runs:/{run_id}/{artifact_path}"


def register_gate(client: Any, run_id: str, name: str, artifact_path: str = GATE_ARTIFACT,
                  description: str | None = None) -> Any:
    """A new version of registered model ``name`` whose source is the gate the run logged."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description=description)
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    return client.create_model_version(name, source=f"runs:/{run_id}/{artifact_path}", run_id=run_id,
                                       description=description)


def fetch(source: str, client: Any, dst: Path) -> Path:
    """Download the gate folder behind a ``runs:/`` or ``models:/`` URI into ``dst``; return it."""
    from mlflow.exceptions import MlflowException

    runs, models = _RUNS.match(source), _MODELS.match(source)
    try:
        if models:
            name, version, alias = models.groups()
            if alias:
                entry = client.get_model_version_by_alias(name, alias)
            elif version in (None, "latest"):
                versions = client.search_model_versions(f"name='{name}'")
                if not versions:
                    raise UserError(f"model={source}: registered model {name!r} has no versions")
                entry = max(versions, key=lambda v: int(v.version))
            else:
                entry = client.get_model_version(name, version)
            if not _RUNS.match(entry.source):
                raise UserError(f"model={source}: version {entry.version} points at {entry.source}; "
                                "expected a runs:/<id>/gate source written by register_gate")
            return fetch(entry.source, client, dst)
        if not runs:
            raise UserError(f"model={source}: expected runs:/<run id>/gate or models:/<name>/<version>")
        run_id, path = runs.groups()
        return Path(client.download_artifacts(run_id, path, str(dst)))
    except MlflowException as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"model={source}: MLflow could not provide it ({reason})") from None
