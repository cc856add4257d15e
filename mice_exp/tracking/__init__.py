"""MLflow tracking: one run per Hydra job, in a project-local SQLite store unless a server is set.

Typical use in a job::

    from mice_exp.tracking import hydra_tags, tracked_run

    with tracked_run(cfg["tracking"], paths.root, run_name="mice_rf/ste",
                     params=cfg, tags={"llm": ..., "estimator": ..., **hydra_tags()}) as run:
        metrics = ...
        run.log_metrics(metrics)
        run.log_figure(fig, "figures/reliability.png")

Importing this package does not import MLflow; opening a run does (seconds, once per process).
"""

from mice_exp.tracking.gitinfo import git_tags
from mice_exp.tracking.params import flatten_params, sanitize_key, truncate
from mice_exp.tracking.run import NullRun, TrackedRun, hydra_tags, tracked_run
from mice_exp.tracking.store import (
    artifact_location,
    ensure_experiment,
    open_client,
    tracking_uri,
)

__all__ = [
    "NullRun",
    "TrackedRun",
    "artifact_location",
    "ensure_experiment",
    "flatten_params",
    "git_tags",
    "hydra_tags",
    "open_client",
    "sanitize_key",
    "tracked_run",
    "tracking_uri",
    "truncate",
]
