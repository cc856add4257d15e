"""The ``mice_exp_slurm`` launcher (conf: ``hydra/launcher=slurm``, ``slurm_gpu``): hydra-submitit-launcher's
SlurmLauncher, one array task per Hydra job, made to behave on a real cluster.

Its ``launch`` (in ``mice_exp.launcher.slurm``, imported only when a sweep is launched) drops the jobs
that already FINISHED, names the Slurm job after the sweep, turns sbatch's refusals into one line,
reports a PENDING array's reason while it waits, waits for every task and lists the failed or
cancelled ones in one line each. Inside the job, ``__call__`` (hydra-submitit-launcher's) is unchanged.
"""

from typing import Any, Sequence

from hydra.core.utils import JobReturn

# the module, not its classes: Hydra's plugin scan registers every Launcher class a module holds
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as _submitit

#: this launcher's own options, kept out of the parameters handed to submitit's executor
OWN_OPTIONS = ("poll_s", "cancel_unrunnable", "skip_finished")


class MiceSlurmLauncher(_submitit.SlurmLauncher):
    def __init__(self, **params: Any) -> None:
        own = {key: params.pop(key) for key in OWN_OPTIONS if key in params}
        super().__init__(**params)
        self.poll_s = float(own.get("poll_s", 10.0))
        self.cancel_unrunnable = bool(own.get("cancel_unrunnable", True))
        self.skip_finished = bool(own.get("skip_finished", True))

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from mice_exp.launcher import slurm
        from mice_exp.run import finished_before, job_config  # the app, only when a sweep is launched

        return slurm.launch(self, job_overrides, initial_job_idx, job_config, finished_before)
