"""Structured config of the ``mice_exp_gpu`` launcher (``hydra/launcher=mice_exp_gpu``)."""

from dataclasses import dataclass
from typing import List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class GpuPoolLauncherConf:
    _target_: str = "hydra_plugins.mice_exp_launcher.gpu_pool_launcher.GpuPoolLauncher"

    # device ids to hand out, one per worker (e.g. [0, 1] or GPU/MIG UUIDs);
    # null = every visible GPU: CUDA_VISIBLE_DEVICES if set, else `nvidia-smi -L` (never CUDA itself)
    gpus: Optional[List[str]] = None
    # parallel workers; null = one per GPU, or n_cpu_workers when there is no GPU.
    # With GPUs it may not exceed their number: each worker owns exactly one GPU.
    n_workers: Optional[int] = None
    # workers when no GPU is visible (or mode=cpu); they run with CUDA_VISIBLE_DEVICES=""
    n_cpu_workers: int = 2
    # auto: GPUs if any, else CPU workers | gpu: fail without a GPU | cpu: CPU workers only
    mode: str = "auto"


ConfigStore.instance().store(
    group="hydra/launcher",
    name="mice_exp_gpu",
    node=GpuPoolLauncherConf,
    provider="mice_exp",
)


# hydra-submitit-launcher's Slurm options plus mice_exp's (conf/hydra/launcher/slurm.yaml sets the values).
# Importing its config module is light: dataclasses only, submitit is imported when a sweep is launched.
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf  # noqa: E402


@dataclass
class MiceSlurmConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.mice_exp_launcher.slurm_launcher.MiceSlurmLauncher"

    # the Slurm job's name; auto = mice_exp:<experiment>, mice_exp:<swept overrides>, or the run name of
    # a single job
    name: str = "auto"
    # seconds between two looks at the array (squeue / sacct) while waiting for it
    poll_s: float = 10.0
    # cancel the array and stop when Slurm says it can never start (PENDING for PartitionConfig, ...)
    cancel_unrunnable: bool = True
    # drop the jobs whose resolved config already has a FINISHED MLflow run before submitting
    skip_finished: bool = True


ConfigStore.instance().store(
    group="hydra/launcher",
    name="mice_exp_slurm",
    node=MiceSlurmConf,
    provider="mice_exp",
)
