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
