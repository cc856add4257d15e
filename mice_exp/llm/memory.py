"""Keep the memory that tensors free inside the process, so the next op reuses it without page faults.

glibc serves every allocation above its mmap threshold (32 MB at most) with a fresh ``mmap`` and gives it
back with ``munmap`` on free. A prefill of 8 x 1,000 tokens through SmolLM2 allocates ~49 MB activations
(the MLP's gate, up and product) several times per layer, so every one of them touches ~12,000 fresh
zero-filled pages: on a 2-core AVX2 CPU the MLP's GEMMs ran at 73 GFLOP/s instead of ~120 and ``silu``
at 1 GB/s, with 2 million minor page faults per batch. Serving large blocks from the heap and never
trimming it removes that (benchmarks/llm_stage.py); the arithmetic is untouched, so every token,
probability and state is bit for bit the same (tests/test_memory.py), at the price of a higher peak RSS
(freed blocks stay with the process until it exits). Not every fault goes: torch allocates with
``posix_memalign``, whose slack can leave a freed block a few bytes short of the next request of the same
size, so a model's mixed pattern of activations faults 1.7-5x less (by kernel), not never.
"""

from __future__ import annotations

import ctypes
import logging

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
KEEP_BYTES = 1 << 30  # free memory at the heap's top kept before trimming: more than a batch's working set
log = logging.getLogger(__name__)
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Serve large allocations from the heap and keep freed pages (once per process).

    Returns whether it applies: True on glibc; False elsewhere (musl, macOS, Windows), where the
    allocator is left as it is and only speed differs.
    """
    global _applied
    if _applied is None:
        _applied = _set_mallopt({M_MMAP_MAX: 0, M_TRIM_THRESHOLD: KEEP_BYTES})
        log.debug("large allocations kept on the heap: %s", _applied)
    return _applied


def _set_mallopt(settings: dict[int, int]) -> bool:
    """glibc's ``mallopt`` for each setting, looked up among the symbols already loaded (no library search)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no such symbol (not glibc) or no CDLL(None) (Windows)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in settings.items())


def trim_heap() -> bool:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim(0)``): what :func:`keep_freed_memory`
    keeps, and the holes that tensors of many sizes leave, both otherwise held until the process exits.
    Returns whether it ran (glibc only)."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    malloc_trim(0)
    return True
