"""One device per worker of a sweep, from the GPUs :mod:`mice_exp.devices` finds (without initialising CUDA).
Pure functions, testable with a fake list of ids.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from mice_exp.devices import CPU_DEVICE, ENV_VAR, run_nvidia_smi, visible_gpus
from mice_exp.errors import UserError

MODES = ("auto", "gpu", "cpu")


class LauncherConfigError(UserError):
    """The launcher's settings (``hydra.launcher.*``) cannot be satisfied on this machine."""


@dataclass(frozen=True)
class WorkerPlan:
    """One ``CUDA_VISIBLE_DEVICES`` value per worker process (``""`` for a CPU worker)."""

    devices: tuple[str, ...]
    on_gpu: bool

    @property
    def n_workers(self) -> int:
        return len(self.devices)

    def describe(self) -> str:
        if not self.on_gpu:
            return f"{self.n_workers} CPU worker(s) ({ENV_VAR}='')"
        return f"{self.n_workers} GPU worker(s), one GPU each ({ENV_VAR}={','.join(self.devices)})"


def plan_workers(
    n_jobs: int,
    *,
    gpus: Sequence[str | int] | None = None,
    n_workers: int | None = None,
    n_cpu_workers: int = 2,
    mode: str = "auto",
    environ: Mapping[str, str] | None = None,
    nvidia_smi: Callable[[], str] = run_nvidia_smi,
) -> WorkerPlan:
    """Assign one distinct GPU to each worker, or plan CPU workers where there is none.

    gpus: the device ids to use; None = every visible GPU (see ``visible_gpus``).
    n_workers: None = one per GPU (``n_cpu_workers`` without GPUs); with GPUs it may not exceed
        their number, since each worker owns exactly one.
    mode: ``auto`` (GPUs if any, else CPU), ``gpu`` (fail without GPUs), ``cpu`` (ignore GPUs).
    Never more workers than jobs.
    """
    if mode not in MODES:
        raise LauncherConfigError(f"hydra.launcher.mode={mode!r}; expected one of {', '.join(MODES)}")
    for name, value in (("n_workers", n_workers), ("n_cpu_workers", n_cpu_workers)):
        if value is not None and int(value) < 1:
            raise LauncherConfigError(f"hydra.launcher.{name}={value}; expected at least 1")
    environ = os.environ if environ is None else environ
    if mode == "cpu":
        devices: list[str] = []
    elif gpus is None:
        devices = visible_gpus(environ, nvidia_smi)
    else:
        devices = [str(g).strip() for g in gpus]
    if len(set(devices)) != len(devices):
        raise LauncherConfigError(f"hydra.launcher.gpus lists a device twice: {devices}; expected each GPU once")
    if mode == "gpu" and not devices:
        raise LauncherConfigError(
            f"hydra.launcher.mode=gpu but no GPU is visible ({ENV_VAR}={environ.get(ENV_VAR, '<unset>')!r}, "
            "no device from nvidia-smi -L); expected a GPU, hydra.launcher.gpus=[0,...] or hydra.launcher.mode=auto "
            "(CPU workers where there is no GPU)")

    if devices:
        count = len(devices) if n_workers is None else int(n_workers)
        if count > len(devices):
            raise LauncherConfigError(
                f"hydra.launcher.n_workers={count} but only {len(devices)} GPU(s) ({','.join(devices)}): each "
                f"worker owns exactly one GPU; expected n_workers <= {len(devices)}")
        chosen = devices[: max(1, min(count, n_jobs))]
        return WorkerPlan(devices=tuple(chosen), on_gpu=True)

    count = int(n_cpu_workers if n_workers is None else n_workers)
    return WorkerPlan(devices=(CPU_DEVICE,) * max(1, min(count, n_jobs)), on_gpu=False)


if __name__ == "__main__":  # python -m mice_exp.launcher.gpus: what a sweep would use here
    print(visible_gpus())
