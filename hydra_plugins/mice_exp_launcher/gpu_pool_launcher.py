"""The ``mice_exp_gpu`` launcher: a multirun's jobs in parallel on one machine, one GPU per worker.

The class must live under ``hydra_plugins`` (Hydra refuses a launcher ``_target_`` elsewhere); the
work is done by ``mice_exp.launcher``, imported only when a sweep is launched.
"""

import logging
from typing import Any, List, Optional, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class GpuPoolLauncher(Launcher):
    def __init__(
        self,
        gpus: Optional[Sequence[Any]] = None,
        n_workers: Optional[int] = None,
        n_cpu_workers: int = 2,
        mode: str = "auto",
    ) -> None:
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

        self.gpus: Optional[List[str]] = None if gpus is None else [str(g) for g in gpus]
        self.n_workers = n_workers
        self.n_cpu_workers = n_cpu_workers
        self.mode = mode

    def setup(
        self,
        *,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
    ) -> None:
        self.config = config
        self.task_function = task_function
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from mice_exp.launcher import hydra_jobs

        return hydra_jobs.launch(launcher=self, job_overrides=job_overrides, initial_job_idx=initial_job_idx)
