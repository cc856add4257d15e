"""Opening a saved gate: its folder (local, or fetched from MLflow), its files read and checked, and the caller's
config and loaded model compared with what the gate was saved with, before anything heavy loads.

A gate answers only under the LLM and feature view it was fitted with, so a mismatch is one
:class:`~mice_exp.errors.UserError` line naming the setting, not a probability from features the estimator
never saw.
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from mice_exp import __version__
from mice_exp.errors import UserError
from mice_exp.gate.artifact import (ENCODER_IDENTITY, ESTIMATOR_FILE, FEATURE_IDENTITY, LLM_IDENTITY, POOL_FILE,
                                    VIEW_FILE, check_estimator, load_estimator, load_pool, load_view, read_spec)
from mice_exp.gate.registry import fetch, is_mlflow_uri
from mice_exp.llm.precision import resolve_dtype
from mice_exp.paths import project_root
from mice_exp.tracking.store import open_client, tracking_uri


def _norm(value: Any) -> Any:
    return None if value in (None, [], {}) else value  # an absent list-valued key means an empty one


def _differences(saved: Mapping[str, Any], asked: Mapping[str, Any], keys: Sequence[str], prefix: str) -> list[str]:
    return [f"{prefix}.{k}={saved.get(k)!r} in the gate but {asked.get(k)!r} in the config"
            for k in keys if _norm(saved.get(k)) != _norm(asked.get(k))]


def _check_llm(saved: Mapping[str, Any], asked: Mapping[str, Any], where: str) -> None:
    if saved.get("name") != asked.get("name"):
        raise UserError(f"the gate {where} was saved for llm={saved.get('name')} ({saved.get('display')}), "
                        f"but the config asks for llm={asked.get('name')}; expected a gate saved by a "
                        f"{asked.get('name')} pipeline, or no llm override")
    if saved.get("dtype") and asked.get("dtype") and saved["dtype"] != asked["dtype"]:  # "auto" against what it
        device = asked.get("device") or "cpu"  # resolves to (a gate saved before dtypes were resolved says "auto")
        saved, asked = ({**cfg, "dtype": resolve_dtype(cfg["dtype"], device)} for cfg in (saved, asked))
    diff = _differences(saved, asked, LLM_IDENTITY, "llm")
    if diff:
        raise UserError(f"the gate {where} was saved by a different {saved.get('name')} setup: {diff[0]}; "
                        "expected the LLM settings the gate was trained with")


def _check_features(saved: Mapping[str, Any], asked: Mapping[str, Any], where: str) -> None:
    diff = _differences(saved, asked, FEATURE_IDENTITY, "features")
    diff += _differences(saved.get("encoder") or {}, asked.get("encoder") or {}, ENCODER_IDENTITY, "features.encoder")
    if diff:
        raise UserError(f"the gate {where} was saved for features={saved.get('name')} but the config asks for "
                        f"features={asked.get('name')} ({diff[0]}); expected the gate's feature view")


#: The parts of a pipeline a caller may expect of a gate, each compared with the gate's own by its check.
PART_CHECKS = {"llm": _check_llm, "features": _check_features}


def check_pipeline(spec: Mapping[str, Any], cfg: Mapping[str, Any], where: str,
                   parts: Sequence[str] = ("llm", "features")) -> None:
    """Refuse (one-line UserError) when the caller's config names another LLM or feature view."""
    for part in parts:
        if part in cfg:
            PART_CHECKS[part](spec[part], cfg[part], where)


def check_model(saved: str, stage: Mapping[str, Any], llm: Any) -> None:
    """Refuse a loaded model other than the gate's (``saved``, ``stage``: its name and its LLM stage's summary):
    another LLM, or the same name with other weights' shapes."""
    if llm.name != saved:
        raise UserError(f"the gate needs llm={saved}; the model given is {llm.name}")
    for key in ("n_layers", "hidden_size"):
        if key in stage and int(stage[key]) != int(getattr(llm, key)):
            raise UserError(f"the gate was trained on a {saved} with {key}={stage[key]}; the loaded model has "
                            f"{getattr(llm, key)}; expected the same weights")


@dataclass(frozen=True)
class Saved:
    """A gate folder's contents, checked: ``gate.json``, the fitted estimator and view (None in a gate saved
    before gates kept their view), the demonstration pool; ``keep``: the temporary download of an MLflow source,
    which lives as long as the gate."""

    folder: Path
    spec: dict[str, Any]
    estimator: Any
    view: Any
    pool: list
    keep: Any = None


def _open_client(tracking: Mapping[str, Any] | str | None, root: Path | None):
    if isinstance(tracking, str):
        return open_client(tracking)
    return open_client(tracking_uri(tracking or {}, Path(root or project_root())))


def open_saved(source: str | Path, expect: Mapping[str, Any] | None, parts: Sequence[str],
               tracking: Mapping[str, Any] | str | None, root: Path | None) -> Saved:
    """A gate folder, or the folder behind ``runs:/<id>/gate`` / ``models:/<name>/<version>``, read and checked
    (:meth:`mice_exp.gate.Gate.load` says what each argument means)."""
    keep = None
    if is_mlflow_uri(str(source)):
        keep = tempfile.TemporaryDirectory(prefix="mice-gate-")
        folder = fetch(str(source), _open_client(tracking, root), Path(keep.name))
    else:
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise UserError(f"model={source}: no such folder; expected a gate folder, runs:/<run id>/gate "
                            "or models:/<name>/<version>")
    spec = read_spec(folder)
    if expect is not None:
        check_pipeline(spec, expect, str(source), parts)
    if spec.get("mice_exp_version") != __version__:
        warnings.warn(f"gate {source} was saved by mice_exp {spec.get('mice_exp_version')}, this is {__version__}",
                      stacklevel=3)
    estimator = load_estimator(folder / ESTIMATOR_FILE, spec["estimator"]["class"])
    check_estimator(estimator, spec["columns"])
    view = None
    if "view" in spec:
        from mice_exp.features import set_runtime  # loads sklearn

        # BERTScores computed, not cached: every batch of queries is a stage keyed "gate"
        view = set_runtime(load_view(folder / VIEW_FILE, spec["view"]["class"]), None, int(spec["seed"]))
    return Saved(folder, spec, estimator, view, load_pool(folder / POOL_FILE), keep)
