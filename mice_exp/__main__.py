"""Entrypoint: ``mice-exp [overrides]`` runs the Hydra app; ``mice-exp inspect ...`` looks inside one example."""

from __future__ import annotations

import shlex
import sys

import hydra
from omegaconf import DictConfig

from mice_exp import errors
from mice_exp.commands import COMMANDS, check_command, usage
from mice_exp.compose import HELP_FLAGS
from mice_exp.errors import JobFailure, Terminated, UserError, fail
from mice_exp.paths import project_root

CONFIG_DIR = str(project_root() / "conf")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def hydra_app(cfg: DictConfig) -> float | None:
    from mice_exp.run import run  # loads numpy

    try:
        return run(cfg).get("objective")
    except UserError as error:  # Hydra would print a traceback; a user error gets one line
        job = _sweep_job(error)
        if job is None:
            fail(error)
        print(f"mice-exp: {job}", file=sys.stderr)
        # through the module: in a pool launcher's worker this function arrives pickled by value, and the
        # launcher reads the worker's own list (mice_exp.launcher.hydra_jobs)
        errors.FAILED_JOBS.append(job)
        return None


def _sweep_job(error: UserError) -> JobFailure | None:
    """The running multirun job failing with ``error``; None outside a multirun."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra_cfg = HydraConfig.get()
    return JobFailure(hydra_cfg.job.num, " ".join(hydra_cfg.overrides.task), str(error))


def main() -> None:
    argv = sys.argv[1:]
    try:
        if argv and argv[0] in HELP_FLAGS:
            print(usage())
        elif argv and argv[0] in COMMANDS:
            COMMANDS[argv[0]](argv[1:])
        else:
            check_command(argv)
            errors.FAILED_JOBS.clear()
            hydra_app()
            if errors.FAILED_JOBS:  # each said so as it failed; the sweep ends with all of them together
                for job in errors.FAILED_JOBS:
                    print(f"mice-exp: {job}", file=sys.stderr)
                numbers = ", ".join(f"#{job.number}" for job in errors.FAILED_JOBS)
                raise UserError(f"{len(errors.FAILED_JOBS)} job(s) of the sweep failed ({numbers}); the others "
                                "ran, and a re-run skips those that finished")
    except UserError as error:
        fail(error)
    except Terminated as error:  # the run is marked (KILLED or FAILED) and every finished batch is on disk
        print(f"mice-exp: stopped by {error} (MLflow run marked {error.status}); every finished LLM-stage batch, "
              f"feature cache and MLflow run is kept, and the same command resumes: mice-exp {shlex.join(argv)}",
              file=sys.stderr)
        sys.exit(143)
    except KeyboardInterrupt:  # caches are written batch by batch, atomically: what finished is on disk
        print("mice-exp: interrupted; every finished LLM-stage batch, feature cache and MLflow run is kept, and "
              f"the same command resumes from them: mice-exp {shlex.join(argv)}", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
