"""Making gates: from a finished run's pieces (:func:`save_run_gate`) or from a config (:func:`fit_gate`)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping

from mice_exp.cache import stable_hash
from mice_exp.gate.artifact import save_gate, unsupported
from mice_exp.gate.registry import log_gate, model_name, register_gate
from mice_exp.paths import Paths


def demo_pool(cfg: Mapping[str, Any], paths: Paths) -> list:
    """The pool the run's LLM stage retrieved demonstrations from (``prompt.demo_pool``)."""
    from mice_exp.data import demo_pool as pool_of, select_examples

    return pool_of(select_examples(cfg["dataset"], paths), cfg["prompt"].get("demo_pool", "all"))


def fit_gate(cfg: Mapping[str, Any], folder: str | Path, paths: Paths | None = None, llm: Any = None) -> Path:
    """Fit the configured estimator on the training split and save the gate to ``folder``.

    ``cfg`` is a resolved config the pipeline accepted (:func:`mice_exp.compose.as_plain`, then
    :func:`mice_exp.config.check_config`): the gate builds on the pipeline, not the other way round.
    The LLM stage and the feature view come from their caches when a run already computed them
    (same config), otherwise they are computed here exactly as ``mice-exp`` would.
    """
    from mice_exp.estimation import build_estimator
    from mice_exp.features import build_features
    from mice_exp.llm.records import read_stage
    from mice_exp.llm.stage import run_llm_stage
    from mice_exp.paths import paths_from
    from mice_exp.protocols import holdout

    paths = paths or paths_from(cfg["paths"])
    stage = read_stage(run_llm_stage(cfg, paths, llm))
    fs = build_features(cfg["features"], stage, paths.features, seed=int(cfg["seed"]))
    _, fitted = holdout(build_estimator(cfg["estimator"], cfg.get("baselines")), fs)
    return save_gate(folder, cfg, fitted, fs.columns, demo_pool(cfg, paths), llm_stage=stage.info,
                     provenance={"llm_cache": stage.key, "train_rows": int(fs.rows("train").sum())})


def save_run_gate(cfg: Mapping[str, Any], paths: Paths, stage: Any, fs: Any, estimator: Any, tracker: Any,
                  register: bool | None = None, name: str | None = None) -> dict[str, Any]:
    """Save the estimator a holdout run fitted as a gate: into the run's artifacts (``gate/``) and,
    with ``register``, as a new version of a registered model; with tracking off, into
    ``<cache>/gates/``. Returns where it went (``uri``, ``model``, ``version``, ``folder``).

    ``register`` and ``name`` default to the config's ``gate`` group (``conf/gate/default.yaml``);
    ``gate.save: false``, inputs the gate cannot rebuild (the pca view, confidence sources other
    than raw; see :func:`mice_exp.gate.artifact.unsupported`) and protocols without one model
    (loao: ``estimator`` is None) save nothing and return {}.
    """
    options = cfg.get("gate") or {}
    register = bool(options.get("register", True)) if register is None else register
    name = name or options.get("name")
    if not options.get("save", True) or estimator is None or unsupported(cfg["features"], cfg.get("estimator")):
        return {}
    provenance = {"run_id": getattr(tracker, "run_id", None), "llm_cache": stage.key,
                  "train_rows": int(fs.rows("train").sum())}
    args = (cfg, estimator, fs.columns, demo_pool(cfg, paths))
    if not getattr(tracker, "enabled", True) or getattr(tracker, "run_id", None) is None:
        key = stable_hash({k: cfg[k] for k in ("llm", "prompt", "features", "estimator", "risk", "dataset", "seed")})
        folder = paths.cache / "gates" / f"{cfg['llm']['name']}-{cfg['features']['name']}-{cfg['estimator']['key']}-{key}"
        save_gate(folder, *args, llm_stage=stage.info, provenance=provenance)
        return {"folder": str(folder)}
    with tempfile.TemporaryDirectory(prefix="mice-gate-") as tmp:
        save_gate(Path(tmp), *args, llm_stage=stage.info, provenance=provenance)
        uri = log_gate(tracker.client, tracker.run_id, tmp)
    result = {"uri": uri}
    if register:
        name = name or model_name(cfg["llm"]["name"], cfg["features"]["name"], cfg["estimator"]["key"])
        version = register_gate(tracker.client, tracker.run_id, name)
        result |= {"model": name, "version": int(version.version)}
    return result
