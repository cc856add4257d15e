"""A Hydra callback that prepares the tracking store before a multirun launches its jobs.

Enable it in ``conf/config.yaml``::

    hydra:
      callbacks:
        prepare_tracking:
          _target_: mice_exp.tracking.hydra_callback.PrepareTracking

In the launching process, before any job starts, it migrates an empty SQLite store and creates
the experiment, so parallel jobs neither pay for nor race on either. It never fails the sweep:
if it cannot prepare the store it logs a warning and each job does the work itself (safely,
under the store's file lock).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from mice_exp.paths import paths_from
from mice_exp.tracking.dashboard import experiment_link, run_link
from mice_exp.tracking.store import ensure_experiment, is_enabled, tracking_uri
from mice_exp.tracking.sweeps import ensure_parent_run

logger = logging.getLogger(__name__)


class PrepareTracking(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            tracking = config.get("tracking")
            if tracking is None or not is_enabled(tracking):
                return
            start = time.perf_counter()
            root = paths_from(config.get("paths") or {}).root
            experiment = ensure_experiment(tracking, root)
            logger.info("MLflow experiment %s ready in %.1fs", experiment, time.perf_counter() - start)

            parent = ensure_parent_run(tracking, root, str(config.hydra.sweep.dir), list(config.hydra.overrides.task))
            uri = tracking_uri(tracking, root)
            print(f"MLflow sweep run: {run_link(uri, experiment, parent)}\n  all runs: {experiment_link(uri, experiment)}")
        except Exception as error:  # noqa: BLE001 - the jobs will prepare the store themselves
            logger.warning("could not prepare the MLflow store before the sweep: %s", error)
