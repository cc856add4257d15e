"""The plain pipeline behind the Hydra entrypoint: ``run(cfg) -> dict`` (easy to call from tests).

The config builds one :class:`~mice_exp.pipeline.Pipeline`; then LLM stage (cached) -> feature view (cached)
-> protocol (estimators, metrics) -> log (:mod:`mice_exp.job`), all inside one MLflow run that ends
FINISHED or FAILED. Nothing here reads the config: each step is an object the pipeline holds.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from mice_exp.config import check_cache
from mice_exp.paths import Paths
from mice_exp.pipeline import Pipeline
from mice_exp.tracking import schema
from mice_exp.tracking.store import ensure_experiment, is_enabled, open_client, tracking_uri
from mice_exp.tracking.sweeps import config_hash, finished_run_with_config, mark_reused


def finished_before(cfg: dict[str, Any], paths: Paths, sweep: str) -> str | None:
    """The id of a FINISHED MLflow run with the same resolved config, so a re-run or resumed sweep skips
    it; the run is tagged as reused by ``sweep``, so the sweep's report still finds it."""
    if not is_enabled(cfg["tracking"]):
        return None
    experiment = ensure_experiment(cfg["tracking"], paths.root)
    client = open_client(tracking_uri(cfg["tracking"], paths.root))
    done = finished_run_with_config(client, experiment, config_hash(cfg))
    if done is not None:
        mark_reused(client, done, sweep)
    return done


def job_config(cfg: DictConfig | dict) -> tuple[dict[str, Any], Paths]:
    """The resolved, checked config a job runs with, records and hashes (:meth:`Pipeline.from_config`), and its
    paths. The Slurm launcher calls it too, before submitting, to drop the jobs :func:`finished_before` finds done."""
    pipeline = Pipeline.from_config(cfg)
    return pipeline.config, pipeline.paths


def run_shard(pipeline: Pipeline) -> dict[str, Any]:
    """``llm.shard=i``: worker i's batches of the LLM stage and nothing else (no estimation, no MLflow run),
    as a Slurm array task or a sweep job over ``llm.shard`` runs it; the stage is whole once every worker has."""
    out = pipeline.stage.run()
    print(pipeline.stage.shard_note(out) or f"llm.shard={pipeline.stage.llm.shard}: the LLM stage is complete "
                                            f"in {out}; runs without llm.shard read it")
    return {"llm_cache": str(out), "complete": (out / "done.json").exists()}


def run(cfg: DictConfig | dict) -> dict[str, Any]:
    """Run the configured pipeline and return its metrics (``objective``: the estimator's AUC-ETCU)."""
    pipeline = Pipeline.from_config(cfg)
    check_cache(pipeline.paths.cache)
    if pipeline.stage.llm.shard is not None:
        return run_shard(pipeline)
    tags = pipeline.tags()
    skips = schema.SWEEP_TAG in tags and not pipeline.force  # only sweep jobs skip; a single run always runs
    done = finished_before(pipeline.config, pipeline.paths, tags[schema.SWEEP_TAG]) if skips else None
    if done is not None:
        print(f"skipping: MLflow run {done} already FINISHED with this resolved config (force=true re-runs it)")
        return {"run_id": done, "skipped": True}
    pipeline.check_inputs()
    from mice_exp.job import log_outcome, log_stage  # loads sklearn, pandas: seconds a refusal above need not wait

    with pipeline.tracked_run(tags) as tracker:
        output = pipeline.stage_output()
        result = log_stage(pipeline, output, tracker)
        if pipeline.estimates:
            result |= log_outcome(pipeline, output, *pipeline.estimate(output), tracker)
        result["run_id"] = getattr(tracker, "run_id", None)
    return result
