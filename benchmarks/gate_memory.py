"""A gate's resident memory over many requests, and how much of its growth is memory the allocator keeps.

``mice-exp serve`` runs every batch on one worker thread; this script does the same in one process, request
after request (STE queries of the first ``--apis`` APIs, cycled up to ``--requests``), and prints the process's
resident memory (VmRSS) at checkpoints. Then it asks glibc to hand back what it holds unused
(``malloc_trim(0)``) and prints VmRSS again: growth that goes away then was freed memory that glibc's heap kept
(fragmentation after tensors of many sizes), not memory anything still holds.

    .venv/bin/python benchmarks/gate_memory.py [--gate experiments/abstention/gate-smollm2_135m] [--requests 100]
        [--apis 10]

``--idle-trim`` hands the free pages back after every request, as ``mice-exp serve`` does whenever its queue
drains. ``--mode score`` replays the gold calls instead of generating (``Gate.score``). Memory, not time: it need
not be run on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.gate_latency import requests  # noqa: E402
from benchmarks.serve_soak import rss_mib  # noqa: E402
from mice_exp.gate import Gate  # noqa: E402
from mice_exp.llm.memory import trim_heap  # noqa: E402
from mice_exp.paths import PACKAGE_ROOT  # noqa: E402

CHECKPOINTS = (1, 5, 10, 25, 50, 75, 100, 150, 200, 300, 400)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gate", default=str(PACKAGE_ROOT / "experiments" / "abstention" / "gate-smollm2_135m"))
    parser.add_argument("--apis", type=int, default=10)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--mode", choices=("check", "score"), default="check")
    parser.add_argument("--idle-trim", action="store_true", help="malloc_trim(0) after each request, as serve does")
    args = parser.parse_args()
    print(f"load average at start {os.getloadavg()}; {os.cpu_count()} cores")
    gate = Gate.load(Path(args.gate))
    queries = requests(args.apis, None)
    items = [queries[n % len(queries)] for n in range(args.requests)]
    print(f"gate {gate.describe()}; {args.requests} requests ({args.mode}, idle trim {args.idle_trim}) over "
          f"{min(args.requests, len(queries))} queries of the first {args.apis} STE APIs")
    worker = ThreadPoolExecutor(1, thread_name_prefix="gate")  # as mice-exp serve runs batches
    start = time.perf_counter()
    for n, (messages, tools, gold) in enumerate(items, start=1):
        if args.mode == "check":
            worker.submit(gate.check, messages, tools).result()
        else:
            worker.submit(gate.score, messages, tools, gold).result()
        if args.idle_trim:
            worker.submit(trim_heap).result()
        if n in CHECKPOINTS or n == len(items):
            print(f"after {n:4d} requests: VmRSS {rss_mib(os.getpid()):7.0f} MiB ({time.perf_counter() - start:6.0f} s)",
                  flush=True)
    held = rss_mib(os.getpid())
    trim_heap()
    print(f"at the end: VmRSS {held:.0f} MiB; after malloc_trim(0): {rss_mib(os.getpid()):.0f} MiB "
          f"(load average at end {os.getloadavg()})")


if __name__ == "__main__":
    main()
