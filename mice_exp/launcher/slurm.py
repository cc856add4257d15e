"""The launching side of the ``mice_exp_slurm`` launcher (``hydra/launcher=slurm``, ``slurm_gpu``).

hydra-submitit-launcher's ``launch`` submits every job of the batch as one Slurm array and then blocks
in ``[job.results()[0] for job in jobs]``: silent while the array is PENDING, a traceback for the first
task that did not complete (while the others still run), sbatch's refusals as tracebacks, every job
named ``__main__``, and finished jobs submitted again only to skip themselves. This ``launch`` builds
the same executor with the same parameters and, around it:

* drops the jobs whose resolved config already has a FINISHED MLflow run (the check a job does itself,
  :func:`mice_exp.run.finished_before`, which also tags the run as reused by this sweep; the Hydra plugin hands
  it in, with :func:`mice_exp.run.job_config`, so nothing here imports the app);
* names the Slurm job after the sweep (:func:`job_name`);
* turns sbatch's refusals into one line naming the resource or partition
  (:func:`~mice_exp.launcher.slurm_cluster.explain_sbatch_error`);
* while waiting, logs one line whenever the tasks' states or PENDING reasons change (``squeue``), and
  cancels an array Slurm can never start (PENDING for ``PartitionConfig`` and the like);
* waits for every task, then lists each failed or cancelled one in one line.

What the cluster says (``sinfo``, ``squeue``, sbatch's refusals) is worded by
:mod:`mice_exp.launcher.slurm_cluster`. Nothing here imports torch or the app.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from hydra.errors import CompactHydraException

from mice_exp.errors import UserError
from mice_exp.launcher.slurm_cluster import (PENDING_HINTS, UNRUNNABLE, asked, explain_sbatch_error,
                                               missing_client, node_summary, squeue_tasks)

log = logging.getLogger(__name__)

#: how many polls an unrunnable reason must persist before the array is cancelled
UNRUNNABLE_POLLS = 2


class SlurmLaunchError(UserError, CompactHydraException):
    """A Slurm problem stated in one line: Hydra prints a CompactHydraException without a traceback (and
    ``mice-exp`` a UserError in one line where Hydra lets it through)."""


# --- before submitting ----------------------------------------------------------------------------------

#: The app's :func:`mice_exp.run.job_config`: a job's config -> its resolved, checked config and paths.
JobConfig = Callable[[Any], tuple[dict, Any]]
#: The app's :func:`mice_exp.run.finished_before`: (config, paths, sweep) -> the FINISHED run holding it, if any.
FinishedBefore = Callable[[dict, Any, str], Optional[str]]


def job_configs(launcher: Any, numbered: Sequence[tuple[int, list[str]]],
                job_config: JobConfig) -> dict[int, tuple[dict, Any]]:
    """Each job's resolved config and paths as its ``run()`` will see them (jobs whose config cannot be
    prepared here are left out: they are submitted and report their own error)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    hydra_config = HydraConfig.instance()
    saved = hydra_config.cfg
    configs = {}
    try:
        for idx, overrides in numbered:
            try:
                sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
                with open_dict(sweep_config.hydra.job):
                    sweep_config.hydra.job.num = idx
                hydra_config.set_config(sweep_config)  # as run_job does: ${hydra:...} resolves as in the job
                task_config = copy.deepcopy(sweep_config)
                with read_write(task_config), open_dict(task_config):
                    del task_config["hydra"]
                configs[idx] = job_config(task_config)
            except Exception as error:  # noqa: BLE001 - the job itself will say what is wrong
                log.warning(f"#{idx}: its config could not be checked before submitting ({error}); submitted")
    finally:
        hydra_config.cfg = saved
    return configs


def finished_jobs(launcher: Any, configs: dict[int, tuple[dict, Any]],
                  finished_before: FinishedBefore) -> dict[int, str]:
    """Job number -> the FINISHED MLflow run that already holds its result (``force=true`` jobs never);
    each such run is tagged as reused by this sweep, so ``mice-exp report --sweep`` still finds it."""
    sweep = str(launcher.config.hydra.sweep.dir)  # the id the jobs tag their runs with (hydra_tags)
    done = {}
    for idx, (cfg, paths) in configs.items():
        if cfg.get("force"):
            continue
        try:
            run_id = finished_before(cfg, paths, sweep)
        except Exception as error:  # noqa: BLE001 - each job checks again itself
            log.warning(f"could not look for finished runs in MLflow ({error}); every job is submitted")
            return {}
        if run_id is not None:
            done[idx] = run_id
    return done


def _swept(overrides: Sequence[str]) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # noqa: BLE001 - only for a name
        return []
    return [o.input_line for o in parsed if o.is_sweep_override() and o.input_line]


def job_name(launcher: Any, todo: Sequence[tuple[int, list[str]]], configs: dict[int, tuple[dict, Any]]) -> str:
    """The Slurm job's name (``hydra.launcher.name``; ``auto``: ``mice_exp:<experiment>`` for a preset,
    the run name for a single job, else ``mice_exp:<swept overrides>``)."""
    name = str(launcher.params.get("name") or "auto")
    if name != "auto":
        return name
    experiment = launcher.config.hydra.runtime.choices.get("experiment")
    if experiment:
        return f"mice_exp:{experiment}"
    if len(todo) == 1 and todo[0][0] in configs:
        from mice_exp.tracking import schema  # loads numpy
        from mice_exp.tracking.dashboard import run_name  # loads numpy

        return f"mice_exp:{run_name(schema.job_tags(configs[todo[0][0]][0])).replace('|', '/')}"  # no | for sacct -P
    swept = _swept(list(launcher.config.hydra.overrides.task))
    return ("mice_exp:" + ";".join(swept).replace(" ", ""))[:100] if swept else "mice_exp"


def _executor(launcher: Any, name: str) -> Any:
    """hydra-submitit-launcher's executor, built as its ``launch`` builds it, with ``name`` as job name."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    params = {**launcher.params, "name": name}
    init_params = {"folder": params["submitit_folder"]}
    specific_init_keys = {"max_num_timeout"}
    init_params.update(**{f"{launcher._EXECUTOR}_{x}": y for x, y in params.items() if x in specific_init_keys})
    init_keys = specific_init_keys | {"submitit_folder"}
    executor = submitit.AutoExecutor(cluster=launcher._EXECUTOR, **init_params)
    baseparams = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{x if x in baseparams else f"{launcher._EXECUTOR}_{x}": y
                                  for x, y in params.items() if x not in init_keys})
    return executor


# --- waiting ---------------------------------------------------------------------------------------------

def _label(state: str, reason: str) -> str:
    if state != "PENDING" or reason in ("None", ""):
        return state
    hint = PENDING_HINTS.get(reason)
    return f"PENDING ({reason}{': ' + hint if hint else ''})"


def describe(array: str, states: Sequence[str]) -> str:
    """``slurm job 12_[0-3]: 2 RUNNING, 2 PENDING (Resources: ...)`` from each task's label."""
    counts = Counter(states)
    name = array if len(states) == 1 else f"{array}_[0-{len(states) - 1}]"
    return f"slurm job {name}: " + ", ".join(f"{n} {label}" for label, n in counts.items())


def wait_for(jobs: Sequence[Any], launcher: Any, params: dict[str, Any]) -> None:
    """Block until every task is done, logging each change of the tasks' states / PENDING reasons."""
    array = jobs[0].job_id.split("_")[0]
    watcher = jobs[0].watcher
    last, unrunnable_seen = None, 0
    while True:
        active = squeue_tasks(array) or {}
        finished = [job.done() for job in jobs]
        if any(not f and job.job_id not in active for f, job in zip(finished, jobs)):
            watcher.update()  # gone from squeue without a result: ask sacct now, not at its next turn
            finished = [job.done() for job in jobs]
        labels = []
        for job, f in zip(jobs, finished):
            if f:  # its result is written (it may still be COMPLETING in squeue), or sacct says it ended
                labels.append("done" if job.paths.result_pickle.exists()
                              else watcher.get_state(job.job_id, mode="cache").split()[0])
            elif job.job_id in active:
                labels.append(_label(*active[job.job_id]))
            else:
                labels.append(watcher.get_state(job.job_id, mode="cache").split()[0])
        line = describe(array, labels)
        if line != last:
            log.info(line)
            last = line
        if all(finished):
            return
        stuck = {reason for state, reason in active.values() if state == "PENDING" and reason in UNRUNNABLE}
        unrunnable_seen = unrunnable_seen + 1 if stuck else 0
        if stuck and launcher.cancel_unrunnable and unrunnable_seen >= UNRUNNABLE_POLLS:
            reason = sorted(stuck)[0]
            subprocess.run(["scancel", array], capture_output=True, timeout=30)
            raise SlurmLaunchError(
                f"slurm launcher: job {array} can never start: PENDING ({reason}: {UNRUNNABLE[reason]}); asked per "
                f"task: {asked(params)}; nodes: {node_summary(params.get('partition'))}. Cancelled it (scancel "
                f"{array}); lower hydra.launcher.cpus_per_task / mem_gb / timeout_min or pick another partition "
                "(hydra.launcher.cancel_unrunnable=false keeps waiting)")
        time.sleep(launcher.poll_s)


# --- after waiting ---------------------------------------------------------------------------------------

def _last_error_line(path: Path) -> str | None:
    """The job's own one-line error (``mice-exp: error: ...``) or the last exception line of its log."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("mice-exp: error:"):
            return line
        if line.startswith("mice-exp: job ") and ") failed: " in line:  # a sweep job's user error (__main__)
            return "mice-exp: error: " + line.split(") failed: ", 1)[1]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Terminated", "Interrupt")) and " " not in head:
            return line
    return None


def _one_line(error: Any) -> str:
    text = str(error).strip()
    if isinstance(error, BaseException):
        first = text.splitlines()[0] if text else ""
        return f"{type(error).__name__}: {first}" if first else type(error).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no message"


#: submitit's error when the job's srun step lost the batch script's environment (SUBMITIT_EXECUTOR)
NO_ENVIRONMENT = "Could not figure out which environment the job is runnning in"
NO_ENVIRONMENT_HINT = ("; the job's srun step saw none of the batch script's variables: this cluster exports no "
                       "environment (SBATCH_EXPORT=NONE or --export=NONE); add "
                       "'hydra.launcher.setup=[\"export SLURM_EXPORT_ENV=ALL\"]' (docs/usage.md, Launchers)")


def outcome(job: Any) -> tuple[Any, str | None]:
    """(the job's JobReturn or None, a one-line problem or None when it completed)."""
    from hydra.core.utils import JobStatus
    from submitit.core.utils import pickle_load

    log_file = Path(job.paths.stderr)
    if job.paths.result_pickle.exists():
        kind, value = pickle_load(job.paths.result_pickle)
        if kind == "success":
            if getattr(value, "status", None) == JobStatus.FAILED:
                return value, f"FAILED: {_one_line(value._return_value)}"
            said = _last_error_line(log_file)  # a user error ends a sweep job normally, after one line
            if said and said.startswith("mice-exp: error: "):
                return value, f"FAILED: {said}"
            return value, None
        return None, f"FAILED: {_one_line(value)}"
    state = job.watcher.get_state(job.job_id, mode="cache")
    said = _last_error_line(log_file) if state.split()[0] not in ("CANCELLED", "TIMEOUT") else None
    problem = f"{state}" + (f": {said}" if said else "")
    return None, problem + (NO_ENVIRONMENT_HINT if said and NO_ENVIRONMENT in said else "")


class SlurmJobsFailed(SlurmLaunchError):
    """Some array tasks did not complete (each listed in the log above)."""


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, job_config: JobConfig,
           finished_before: FinishedBefore) -> list[Any]:
    """hydra-submitit-launcher's ``launch`` (see the module docstring for what differs); ``job_config`` and
    ``finished_before``: the app's, handed in by the Hydra plugin, so the launcher does not import the app."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobReturn, JobStatus, filter_overrides
    from submitit.core.utils import FailedJobError

    assert launcher.config is not None
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if "mode" in launcher.config.hydra.sweep:
        os.chmod(sweep_dir, mode=int(str(launcher.config.hydra.sweep.mode), 8))
    numbered = [(initial_job_idx + i, list(overrides)) for i, overrides in enumerate(job_overrides)]
    if not numbered:
        return []
    problem = missing_client()
    if problem is not None:
        raise SlurmLaunchError(problem)

    configs = job_configs(launcher, numbered, job_config)
    skipped = finished_jobs(launcher, configs, finished_before) if launcher.skip_finished else {}
    returns: dict[int, JobReturn] = {}
    for idx, overrides in numbered:
        if idx in skipped:
            returns[idx] = JobReturn(overrides=overrides, status=JobStatus.COMPLETED, _return_value=None)
    if skipped:
        log.info(f"skipping {len(skipped)} of {len(numbered)} jobs: their resolved config already has a FINISHED "
                 f"MLflow run (#{', #'.join(str(i) for i in sorted(skipped))}; force=true re-runs them)")
    todo = [(idx, overrides) for idx, overrides in numbered if idx not in skipped]
    if not todo:
        return [returns[idx] for idx, _ in numbered]

    name = job_name(launcher, todo, configs)
    executor = _executor(launcher, name)
    log.info(f"Submitit '{launcher._EXECUTOR}' sweep output dir : {sweep_dir}")
    for idx, overrides in todo:
        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
    state = Singleton.get_state()
    job_params = [(overrides, "hydra.sweep.dir", idx, f"job_id_for_{idx}", state) for idx, overrides in todo]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):  # submitit prints sbatch's stderr before raising it
            jobs = executor.map_array(launcher, *zip(*job_params))
    except FailedJobError as error:
        raise SlurmLaunchError(explain_sbatch_error(f"{said.getvalue()}\n{error}", launcher.params)) from None
    except FileNotFoundError as error:
        raise SlurmLaunchError(f"slurm launcher: {error.filename or 'sbatch'} not found: no Slurm client on "
                               "this machine (expected sbatch, squeue and sacct in PATH)") from None
    array = jobs[0].job_id.split("_")[0]
    log.info(f"submitted {len(jobs)} job(s) as Slurm job {array} named {name!r}")
    try:
        wait_for(jobs, launcher, launcher.params)
    except KeyboardInterrupt:
        log.warning(f"stopped waiting; Slurm job {array} keeps running (scancel {array} stops it)")
        raise
    jobs[0].watcher.update()

    failed = []
    for (idx, overrides), job in zip(todo, jobs):
        ret, problem = outcome(job)
        if problem is None:
            returns[idx] = ret
            continue
        failed.append(problem.split(":")[0].split()[0])
        log.error(f"job {job.job_id} (#{idx}: {' '.join(filter_overrides(overrides))}) {problem} "
                  f"(log: {job.paths.stderr})")
        returns[idx] = ret if ret is not None else JobReturn(overrides=overrides, status=JobStatus.FAILED)
        returns[idx].status = JobStatus.FAILED
    if failed:
        counts = ", ".join(f"{n} {state}" for state, n in Counter(failed).items())
        error = SlurmJobsFailed(
            f"slurm launcher: {len(failed)} of {len(numbered)} jobs did not complete ({counts}; listed above); "
            "running the same command again runs only them (the FINISHED ones are skipped)")
        for idx, _ in numbered:
            if returns[idx].status == JobStatus.FAILED:
                returns[idx].return_value = error
    return [returns[idx] for idx, _ in numbered]
