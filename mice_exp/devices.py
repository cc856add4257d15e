"""The ground floor of running processes: which GPUs this machine shows, counted without initialising CUDA, and
a process's exit status in words. The launchers (:mod:`mice_exp.launcher`) and the LLM stage's local workers
(:mod:`mice_exp.llm.shards`) both read them, so neither imports the other.

``torch.cuda.device_count()`` would initialise CUDA in the launching process; instead the GPUs are
read from ``CUDA_VISIBLE_DEVICES`` when it is set, else from ``nvidia-smi -L``. Pure functions,
testable with a fake list of ids.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from typing import Any, Callable, Mapping

from mice_exp.errors import UserError

ENV_VAR = "CUDA_VISIBLE_DEVICES"
CPU_DEVICE = ""  # CUDA_VISIBLE_DEVICES="" hides every GPU from a worker


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


def run_nvidia_smi() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):  # not installed, no driver, hung
        return ""
    return done.stdout if done.returncode == 0 else ""


def visible_gpus(
    environ: Mapping[str, str] | None = None,
    nvidia_smi: Callable[[], str] = run_nvidia_smi,
) -> list[str]:
    """The GPUs this process may hand out, without touching CUDA.

    ``CUDA_VISIBLE_DEVICES`` wins when set (an empty value means none); otherwise every GPU
    ``nvidia-smi -L`` lists; no ``nvidia-smi`` means no GPUs.
    """
    environ = os.environ if environ is None else environ
    if ENV_VAR in environ:
        return parse_visible_devices(environ[ENV_VAR])
    return parse_nvidia_smi(nvidia_smi())


def describe_exit(code: int | None) -> str:
    """A process's exit status in words (``exit code 1``, ``signal SIGKILL``), as ``Popen`` and ``Process`` give it."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def resolve_device(name: str, key: str = "llm.device") -> Any:
    """The torch device a ``*.device`` setting (``key``) names; ``auto``: the GPU where CUDA sees one, else the CPU.
    Every model the project loads (the LLM, BERTScore's and the retrieval's encoders) goes through it."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"{key}={name} but no CUDA device is visible; expected {key}=cpu or auto")
    return torch.device(name)
