"""Which GPUs a sweep may use, counted without initialising CUDA, and one device per worker.

``torch.cuda.device_count()`` would initialise CUDA in the launching process; instead the GPUs are
read from ``CUDA_VISIBLE_DEVICES`` when it is set, else from ``nvidia-smi -L``. Pure functions,
testable with a fake list of ids.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from mice_exp.errors import UserError

ENV_VAR = "CUDA_VISIBLE_DEVICES"
CPU_DEVICE = ""  # CUDA_VISIBLE_DEVICES="" hides every GPU from a worker
MODES = ("auto", "gpu", "cpu")


class LauncherConfigError(UserError):
    """The launcher's settings (``hydra.launcher.*``) cannot be satisfied on this machine."""


def parse_visible_devices(value: str) -> list[str]:
    """The device ids in a ``CUDA_VISIBLE_DEVICES`` value, as CUDA reads it.

    Ids are kept as written (``"2"``, ``"GPU-<uuid>"``, ``"MIG-<uuid>"``) so a worker is pinned to
    the same physical device the parent was given. CUDA stops at the first invalid entry, so a
    negative index (``"-1"``, the usual way to hide all GPUs) ends the list.
    """
    devices: list[str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or re.fullmatch(r"-\d+", entry):
            break
        devices.append(entry)
    return devices


_SMI_GPU = re.compile(r"^GPU (\d+):.*\(UUID: (GPU-[^)\s]+)\)")
_SMI_MIG = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)\s]+)\)")


def parse_nvidia_smi(output: str) -> list[str]:
    """Device ids from ``nvidia-smi -L``: GPU indices, or MIG UUIDs where a GPU is partitioned.

    A MIG instance is what one CUDA process can use, so each one is a device of its own.
    """
    devices: list[str] = []
    gpu: str | None = None
    migs: list[str] = []

    def flush() -> None:
        if gpu is not None:
            devices.extend(migs or [gpu])

    for line in output.splitlines():
        if m := _SMI_GPU.match(line):
            flush()
            gpu, migs = m.group(1), []
        elif (m := _SMI_MIG.match(line)) and gpu is not None:
            migs.append(m.group(1))
    flush()
    return devices


def _run_nvidia_smi() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):  # not installed, no driver, hung
        return ""
    return done.stdout if done.returncode == 0 else ""


def visible_gpus(
    environ: Mapping[str, str] | None = None,
    nvidia_smi: Callable[[], str] = _run_nvidia_smi,
) -> list[str]:
    """The GPUs this process may hand out, without touching CUDA.

    ``CUDA_VISIBLE_DEVICES`` wins when set (an empty value means none); otherwise every GPU
    ``nvidia-smi -L`` lists; no ``nvidia-smi`` means no GPUs.
    """
    environ = os.environ if environ is None else environ
    if ENV_VAR in environ:
        return parse_visible_devices(environ[ENV_VAR])
    return parse_nvidia_smi(nvidia_smi())


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
    nvidia_smi: Callable[[], str] = _run_nvidia_smi,
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
