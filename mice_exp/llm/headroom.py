"""A warning line before an LLM batch that may not fit in memory.

On long prompts (BFCL's ~6,000-token calls) a batch of 8 takes 10-13 GB; when the machine runs out,
the kernel kills the process without a word, and the log ends on a progress bar. Batches run in
prompt-length order, so the longest comes last and each batch's peak can be foretold from the one
before it: the peak memory above the loaded model, scaled by the square of the prompt lengths
(attention's masks grow with T x T; the rest grows with T). The scaling overestimates, which is the
safe side for a warning; it never stops a run.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

GIB = 1 << 30


def _meminfo_available(path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What a cgroup v2 limit (a container, a SLURM job) still leaves, or None without one."""
    try:
        limit = (root / "memory.max").read_text().strip()
        used = int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) - used


def available_bytes() -> int | None:
    """Memory this process may still take: the kernel's MemAvailable, capped by a cgroup limit."""
    known = [b for b in (_meminfo_available(), _cgroup_available()) if b is not None]
    return min(known) if known else None


def resident_bytes() -> int | None:
    """The process's resident memory now (Linux), or None where /proc is absent."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_bytes() -> int:
    """The process's peak resident memory so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@dataclass
class Headroom:
    """Call :meth:`start` once the model is loaded, :meth:`done` after each batch with its longest prompt,
    and :meth:`warning` before the next batch (None when it fits, or when nothing is known yet)."""

    available: Callable[[], int | None] = available_bytes
    resident: Callable[[], int | None] = resident_bytes
    peak: Callable[[], int] = peak_bytes
    loaded: int = 0
    last_tokens: int | None = None

    def start(self) -> None:
        self.loaded = self.peak()

    def done(self, tokens: int) -> None:
        self.last_tokens = tokens

    def expected_peak(self, tokens: int) -> int | None:
        """The next batch's peak memory (bytes), scaled from the peak so far by (tokens / last tokens)^2."""
        if not self.last_tokens:
            return None
        grown = max(self.peak() - self.loaded, 0)
        return self.loaded + int(grown * max(tokens / self.last_tokens, 1.0) ** 2)

    def warning(self, batch: int, tokens: int) -> str | None:
        expected, available, resident = self.expected_peak(tokens), self.available(), self.resident()
        if expected is None or available is None or resident is None or expected - resident <= available:
            return None
        return (f"the next batch ({batch} prompts of up to {tokens:,} tokens) may need {expected / GIB:.1f} GiB, "
                f"{(resident + available) / GIB:.1f} GiB are within reach: if the process is killed now, memory "
                f"was why; finished batches are kept and the same command resumes (run fewer jobs at once, or a "
                "smaller llm.batch_size, which starts this stage afresh)")
