"""The Hydra side of the ``mice_exp_gpu`` launcher, mirroring hydra_joblib_launcher's ``_core``.

``launch`` runs in the launching process: it configures Hydra's logging, creates the sweep dir,
plans one GPU per worker (``gpus.plan_workers``, without touching CUDA) and hands the jobs to
``pool.run_on_devices``. ``execute_job`` runs in a worker: it restores Hydra's singletons, builds
the job's sweep config and calls ``run_job``, as joblib's ``execute_job`` does.

A job's user error fails that job alone, as under Hydra's default launcher: the worker's task
function records it in the worker's :data:`mice_exp.errors.FAILED_JOBS`, ``execute_job`` sends it
back with the job's return, and ``launch`` adds it to the launching process's list, from which the
entrypoint ends the sweep with one line per failed job.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Dict, List, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from mice_exp import errors
from mice_exp.errors import JobFailure, fail
from mice_exp.launcher.gpus import LauncherConfigError, plan_workers
from mice_exp.launcher.pool import add_traceback_note, run_on_devices

log = logging.getLogger(__name__)


def execute_job(
    item: tuple[int, List[str]],
    hydra_context: HydraContext,
    config: DictConfig,
    task_function: TaskFunction,
    singleton_state: Dict[Any, Any],
) -> tuple[JobReturn, list[JobFailure]]:
    """Run one job of the sweep in a worker process (joblib launcher's ``execute_job``); also returns the
    user errors the job recorded, which the launching process would not see otherwise."""
    idx, overrides = item
    setup_globals()
    Singleton.set_state(singleton_state)

    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)

    recorded = len(errors.FAILED_JOBS)  # a worker runs several jobs
    ret = run_job(
        hydra_context=hydra_context,
        config=sweep_config,
        task_function=task_function,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    if ret.status == JobStatus.FAILED and isinstance(ret._return_value, BaseException):
        add_traceback_note(ret._return_value, where="job's worker")  # otherwise lost with the process
    return ret, errors.FAILED_JOBS[recorded:]


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """
    :param job_overrides: a list of lists of strings, the overrides of each job.
    :param initial_job_idx: index of the first job of this batch within the sweep.
    :return: one JobReturn per job, in order (a failed job's return_value raises its error).
    """
    setup_globals()
    assert launcher.config is not None
    assert launcher.task_function is not None
    assert launcher.hydra_context is not None

    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if not job_overrides:
        return []

    try:
        plan = plan_workers(
            len(job_overrides),
            gpus=launcher.gpus,
            n_workers=launcher.n_workers,
            n_cpu_workers=launcher.n_cpu_workers,
            mode=launcher.mode,
        )
    except LauncherConfigError as error:  # Hydra would wrap the one line in its traceback
        fail(error)
    log.info(f"GpuPool launcher is launching {len(job_overrides)} jobs on {plan.describe()}")
    if not plan.on_gpu and launcher.mode == "auto":
        log.info("No GPU visible (CUDA_VISIBLE_DEVICES / nvidia-smi -L): jobs run on CPU workers")
    log.info(f"Launching jobs, sweep output dir : {sweep_dir}")
    items = [(initial_job_idx + i, list(overrides)) for i, overrides in enumerate(job_overrides)]
    for idx, overrides in items:
        log.info("\t#{} : {}".format(idx, " ".join(filter_overrides(overrides))))

    task = functools.partial(
        execute_job,
        hydra_context=launcher.hydra_context,
        config=launcher.config,
        task_function=launcher.task_function,
        singleton_state=Singleton.get_state(),
    )
    outcomes = run_on_devices(task, items, plan.devices)

    runs: List[JobReturn] = []
    for (idx, overrides), outcome in zip(items, outcomes):
        if outcome.ok:
            ret, failures = outcome.value
            assert isinstance(ret, JobReturn)
            errors.FAILED_JOBS.extend(failures)
        else:  # the job never got to return one (a crash, an error before run_job, sys.exit)
            ret = JobReturn(overrides=overrides, status=JobStatus.FAILED)
            ret.return_value = outcome.error
        if ret.status == JobStatus.FAILED:
            error = ret._return_value
            log.error(f"#{idx} : {' '.join(filter_overrides(overrides))} FAILED "
                      f"(pid {outcome.pid}, CUDA_VISIBLE_DEVICES={outcome.device!r}): {error!r}")
        runs.append(ret)
    return runs
