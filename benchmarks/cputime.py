"""CPU seconds of a benchmark's whole process tree, for the wall-vs-CPU figures of benchmarks/*.py, and the line
that names the CPU beside every figure."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path

import psutil
import torch

from mice_exp.llm.precision import cpu_flags, native_bf16


def cpu_seconds(extra: Sequence[int] = ()) -> float:
    """User + system CPU of this process, of its children (live ones and those it reaped: joblib's workers)
    and of the processes ``extra`` with their children (a server started elsewhere)."""
    me = psutil.Process()
    own = me.cpu_times()
    total = own.user + own.system + own.children_user + own.children_system
    procs = [*me.children(recursive=True)]
    procs += [p for pid in extra for p in (psutil.Process(pid), *psutil.Process(pid).children(recursive=True))]
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def cpu_line() -> str:
    """The CPU's model, its vector extensions and bf16, and torch's view of it (capability, threads)."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    flags = cpu_flags()
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    bf16 = "native bf16 (" + ", ".join(sorted(flags & {"avx512_bf16", "amx_bf16"})) + ")" if native_bf16() else \
        "no native bf16"
    return (f"{model}; {simd}, {bf16}; torch {torch.__version__} capability {torch.backends.cpu.get_cpu_capability()}"
            f", {torch.get_num_threads()} threads, {os.cpu_count()} cores")
