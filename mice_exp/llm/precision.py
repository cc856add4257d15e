"""Which dtype the LLM runs in: ``llm.dtype=auto`` resolved by what the hardware does natively.

Torch-free (a CUDA device is the one case that asks torch), so a run resolves the dtype before the
cache key, the MLflow params and the gate see it: ``auto`` and the dtype it picks are the same run.

``auto`` is float32 on every CPU. On CPUs without native bf16 (AVX2 only) bf16 matmuls are emulated
and several times slower than float32; on CPUs with ``avx512_bf16`` / AMX bf16 is faster, but it
changes what small models write (see the README's measured figures), so it stays a deliberate choice.
On a GPU that supports it, ``auto`` is bfloat16 (the papers' 8B models in half the memory).
"""

from __future__ import annotations

import logging
from pathlib import Path

from mice_exp.errors import UserError

DTYPES = ("auto", "float32", "bfloat16", "float16")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
log = logging.getLogger(__name__)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo does not exist)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX-512 BF16 or AMX), not by emulation."""
    return bool(cpu_flags() & set(NATIVE_BF16_FLAGS))


def resolve_dtype(name: str, device: str) -> str:
    """The concrete dtype for ``llm.dtype=name`` on ``llm.device=device``; bf16 on a CPU that only
    emulates it is allowed but warned about in one line."""
    if name not in DTYPES:
        raise UserError(f"llm.dtype={name!r}; expected one of {', '.join(DTYPES)}")
    on_gpu = device.startswith("cuda") or (device == "auto" and _cuda_available())
    if name == "auto":
        if not on_gpu:
            return "float32"
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if name == "bfloat16" and device == "cpu" and not native_bf16():
        log.warning("llm.dtype=bfloat16 on a CPU without native bf16 (no avx512_bf16 / amx_bf16): expect it to "
                    "be several times slower than llm.dtype=float32 (or auto)")
    return name


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
