"""Making gates: from a finished run's pieces (:func:`save_run_gate`) or from a config (:func:`fit_gate`);
both take the run's :class:`~mice_exp.pipeline.Pipeline`, the gate builds on the pipeline."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mice_exp.cache import stable_hash
from mice_exp.discover import class_path
from mice_exp.gate.artifact import risk_spec, save_gate
from mice_exp.gate.registry import log_gate, model_name, register_gate
from mice_exp.paths import Paths
from mice_exp.pipeline import Pipeline

if TYPE_CHECKING:  # annotations only
    from mice_exp.features import FeatureSet
    from mice_exp.llm.records import StageOutput
    from mice_exp.pipeline import Pipeline


def gate_key(pipeline: Pipeline) -> str:
    """What names a gate saved without tracking (``<cache>/gates/<...>-<hash>``): the LLM stage's settings, the
    view's node, the estimator (class and parameters), the risk and the seed."""
    stage, study = pipeline.stage, pipeline.study
    main = study.main
    return stable_hash({"llm": stage.llm.as_dict(), "prompt": stage.prompt.as_dict(),
                        "dataset": stage.dataset.settings,
                        "features": pipeline.feature_settings,
                        "estimator": {"key": main.key, "class": class_path(main.estimator),
                                      "params": main.estimator.get_params()},
                        "risk": risk_spec(study.risk, study.risks[study.risk]), "seed": study.seed})


def fit_gate(cfg: Any, folder: str | Path, paths: Paths | None = None, llm: Any = None) -> Path:
    """Fit the configured estimator on the training split and save the gate to ``folder``.

    ``cfg`` is a config the pipeline accepts (:meth:`mice_exp.pipeline.Pipeline.from_config` resolves and
    checks it). The LLM stage and the feature view come from their caches when a run already computed them
    (same config), otherwise they are computed here exactly as ``mice-exp`` would; ``llm``: a backend
    already loaded.
    """
    from mice_exp.protocols import holdout  # loads matplotlib, sklearn

    pipeline = Pipeline.from_config(cfg, paths, llm)
    stage = pipeline.stage_output()
    fs = pipeline.features(stage)
    _, fitted = holdout(pipeline.study.main.estimator, fs)
    return save_gate(folder, pipeline, fitted, fs.view, pipeline.demo_pool(), llm_stage=stage.info,
                     provenance={"llm_cache": stage.key, "train_rows": int(fs.rows("train").sum())},
                     arguments=pipeline.argument_rule(stage.records))


def save_run_gate(pipeline: Pipeline, stage: StageOutput, fs: FeatureSet, estimator: Any, tracker: Any,
                  register: bool | None = None, name: str | None = None) -> dict[str, Any]:
    """Save the estimator a holdout run fitted as a gate: into the run's artifacts (``gate/``) and,
    with ``register``, as a new version of a registered model; with tracking off, into
    ``<cache>/gates/``. Returns where it went (``uri``, ``model``, ``version``, ``folder``).

    ``register`` and ``name`` default to the pipeline's ``gate`` group (``conf/gate/default.yaml``);
    ``gate.save: false``, inputs the gate cannot rebuild (confidence sources other than raw, hidden-state
    estimators; see :meth:`mice_exp.pipeline.Pipeline.gate_unsupported`) and protocols without one model
    (loao: ``estimator`` is None) save nothing and return {}.
    """
    options, study = pipeline.gate, pipeline.study
    register = bool(options.get("register", True)) if register is None else register
    name = name or options.get("name")
    if not options.get("save", True) or estimator is None or pipeline.gate_unsupported():
        return {}
    provenance = {"run_id": getattr(tracker, "run_id", None), "llm_cache": stage.key,
                  "train_rows": int(fs.rows("train").sum())}
    args = (pipeline, estimator, fs.view, pipeline.demo_pool())
    kwargs = {"llm_stage": stage.info, "provenance": provenance, "arguments": pipeline.argument_rule(stage.records)}
    names = (pipeline.stage.llm.name, pipeline.feature_settings["name"], study.main.key)
    if not getattr(tracker, "enabled", True) or getattr(tracker, "run_id", None) is None:
        folder = pipeline.paths.cache / "gates" / f"{'-'.join(names)}-{gate_key(pipeline)}"
        save_gate(folder, *args, **kwargs)
        return {"folder": str(folder)}
    with tempfile.TemporaryDirectory(prefix="mice-gate-") as tmp:
        save_gate(Path(tmp), *args, **kwargs)
        uri = log_gate(tracker.client, tracker.run_id, tmp)
    result = {"uri": uri}
    if register:
        name = name or model_name(*names)
        version = register_gate(tracker.client, tracker.run_id, name)
        result |= {"model": name, "version": int(version.version)}
    return result
