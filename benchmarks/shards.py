"""One LLM stage on 1 worker x 2 threads against 2 workers x 1 thread (`llm.shards=2`), on the same cores.

Each is the whole `mice-exp stage=llm` command (python start-up, retrieval, model loads, prompts,
generation), run as a subprocess into a fresh cache folder, with the benchmark pinned to `--cores`
CPUs (the workers inherit the pinning, so each gets cores // 2 threads). Prints the CPU (lscpu), the
load (uptime) before and after, both wall times and their ratio, and compares the two stages: bit for bit,
or, where only the probabilities and states differ (another number of threads per process can round
some of torch's CPU reductions differently), by how much; exits 1 where a generated token, call or
label differs. ``--same-threads`` adds 1 worker x a worker's threads, which the 2 workers must equal
bit for bit (exit 1 otherwise).

    .venv/bin/python benchmarks/shards.py [--llm smollm2_135m] [--apis 3] [--cores 2] [--same-threads]

Run it on a quiet machine (load average < 1.5); `--llm tiny_random` only checks that it works.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mice_exp.compose import as_plain, compose_config
from mice_exp.llm.backends import load_llm
from mice_exp.llm.settings import LLMSettings
from mice_exp.llm.records import ARRAYS, read_stage
from mice_exp.paths import PACKAGE_ROOT, paths_from


def command_line(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=False).stdout.strip()


def cpu_model() -> str:
    return next((line.split(":", 1)[1].strip() for line in command_line("lscpu").splitlines()
                 if line.startswith("Model name")), "unknown (no lscpu)")


def timed_stage(overrides: list[str], cache: Path, models: Path, threads: int) -> tuple[float, Path]:
    """Wall seconds of `mice-exp stage=llm` into the fresh cache folder ``cache`` (sharing the converted
    models), with ``threads`` threads in its own process; and the stage folder it wrote."""
    cache.mkdir(parents=True)
    (cache / "models").symlink_to(models)  # the converted weights are not part of the stage
    command = [sys.executable, "-m", "mice_exp", "stage=llm", "tracking.enabled=false", f"paths.cache={cache}",
               f"hydra.run.dir={cache / 'hydra'}", *overrides]
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    if subprocess.run(command, env=env, cwd=PACKAGE_ROOT, check=False).returncode:
        sys.exit(f"shards.py: {' '.join(command[1:])} failed (its error is above)")
    return time.perf_counter() - start, next((cache / "llm").iterdir())


PROBABILITIES = ("token_probs", "raw_confidence", "min_probability")  # record fields computed in floating point


def compare(folder: Path, reference: Path) -> tuple[bool, bool, str]:
    """Whether two stage folders are the same bit for bit, whether they generated the same (every record
    field but the probabilities), and a line saying how close they are."""
    mine, theirs = read_stage(folder), read_stage(reference)
    if folder.name != reference.name or mine.ids != theirs.ids:
        return False, False, (f"different stages: {folder.name} ({len(mine.ids)} calls) vs {reference.name} "
                              f"({len(theirs.ids)})")
    pairs = list(zip(mine.records, theirs.records))
    same = [a.keys() == b.keys() and all(a[k] == b[k] for k in a if k not in PROBABILITIES) for a, b in pairs]
    gap = max((float(np.abs(np.subtract(a["token_probs"], b["token_probs"])).max(initial=0))
               for (a, b), s in zip(pairs, same) if s), default=0.0)
    states = max(float(np.abs(mine.arrays(n) - theirs.arrays(n)).max()) for n in ARRAYS)
    if all(a == b for a, b in pairs) and states == 0:
        return True, True, "identical, bit for bit (records and pooled arrays)"
    return False, all(same), (f"generated tokens, calls, labels and layer strings identical for {sum(same)}/"
                              f"{len(same)} calls; probabilities within {gap:.2g}, pooled states within {states:.2g} "
                              "(torch's CPU kernels round some reductions differently with another number of "
                              "threads per process)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm", default="smollm2_135m")
    parser.add_argument("--apis", type=int, default=3, help="first N STE APIs (15 calls each)")
    parser.add_argument("--cores", type=int, default=2, help="CPUs the benchmark and every process it starts use")
    parser.add_argument("--same-threads", action="store_true",
                        help="also 1 worker x a worker's threads: the 2 workers' records must equal its bit for bit")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))[:args.cores]
    os.sched_setaffinity(0, cores)  # inherited by every process started from here: the workers share these
    print(f"cpu: {cpu_model()}; pinned to CPUs {cores}")
    print(f"load before: {command_line('uptime')}")
    overrides = [f"llm={args.llm}", f"dataset.max_apis={args.apis}"]
    models = paths_from({}).models
    # converts packaged weights once, before any timing
    load_llm(LLMSettings.from_config(as_plain(compose_config(overrides))["llm"]), models)
    tmp = Path(tempfile.mkdtemp(prefix="shards_"))
    per_worker = max(1, len(cores) // 2)
    one, one_out = timed_stage(overrides, tmp / "one", models, threads=len(cores))
    two, two_out = timed_stage(overrides + ["llm.shards=2"], tmp / "two", models, threads=len(cores))
    _, same, closeness = compare(two_out, one_out)
    print(f"\n{args.llm}, {len(read_stage(one_out).records)} calls, `mice-exp stage=llm` wall time:")
    for label, seconds in ((f"1 worker  x {len(cores)} thread(s)", one), (f"2 workers x {per_worker} thread(s)", two)):
        print(f"  {label + ':':<28}{seconds:8.1f} s")
    print(f"  ratio (1 worker / 2 workers): {one / two:.2f}x")
    print(f"2 workers against 1 worker x {len(cores)} threads: {closeness}")
    if args.same_threads:
        wall, out = timed_stage(overrides, tmp / "one-thin", models, threads=per_worker)
        exact, _, closeness = compare(two_out, out)
        same = same and exact
        print(f"2 workers against 1 worker x {per_worker} thread(s) ({wall:.1f} s): {closeness}")
    print(f"load after: {command_line('uptime')}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
