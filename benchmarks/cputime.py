"""CPU seconds of a benchmark's whole process tree, for the wall-vs-CPU figures of benchmarks/*.py."""

from __future__ import annotations

from collections.abc import Sequence

import psutil


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
