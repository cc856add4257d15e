"""Eight jobs writing to one embedded SQLite MLflow store at once: does any run fail or go missing?

Each of ``--jobs`` processes starts at the same moment on a fresh store (so they also race on
the schema migration and the experiment's creation) and logs ``--runs`` runs shaped like a
sweep job of mice_exp: the flattened config as params (~300), ~70 metrics, a predictions table
and three small artifacts, through :func:`mice_exp.tracking.tracked_run`, exactly as a job does.
The same work is then done by one process for comparison.

    .venv/bin/python benchmarks/mlflow_parallel.py [--jobs 8] [--runs 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CFG = {"uri": None, "experiment": "bench", "enabled": True}

JOB = textwrap.dedent(
    """
    import sys, time
    import numpy as np, pandas as pd
    from mice_exp.tracking import tracked_run
    root, job, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    params = {"group": {f"key{i}": i for i in range(300)}, "job": job}
    for n in range(runs):
        with tracked_run(CFG, root, f"job{job}-{n}", params, {"sweep": "bench", "job": str(job)}) as run:
            run.log_metrics({f"metric_{i}": float(i) for i in range(70)})
            run.log_table(pd.DataFrame({"p": np.linspace(0, 1, 200)}), "predictions.csv")
            for name in ("a", "b", "c"):
                run.log_text("x" * 2000, f"notes/{name}.txt")
    """
)


def launch(root: Path, jobs: int, runs: int) -> tuple[float, list[str]]:
    script = f"CFG = {CFG!r}\n" + JOB
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", script, str(root), str(j), str(runs)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for j in range(jobs)]
    errors = [p.communicate()[1].decode() for p in procs]
    wall = time.perf_counter() - start
    return wall, [e for p, e in zip(procs, errors) if p.returncode != 0]


def count(root: Path) -> dict[str, int]:
    from mice_exp.tracking.store import open_client, tracking_uri

    client = open_client(tracking_uri(CFG, root))
    exp = client.get_experiment_by_name(CFG["experiment"])
    statuses: dict[str, int] = {}
    for run in client.search_runs([exp.experiment_id], max_results=10_000):
        statuses[run.info.status] = statuses.get(run.info.status, 0) + 1
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as parallel, tempfile.TemporaryDirectory() as single:
        wall, failed = launch(Path(parallel), args.jobs, args.runs)
        statuses = count(Path(parallel))
        locked = sum("database is locked" in e for e in failed)
        print(f"{args.jobs} parallel processes x {args.runs} runs: {wall:.1f} s wall; runs by status {statuses}; "
              f"failed processes {len(failed)} ({locked} with 'database is locked')")
        for error in failed:
            print(error.strip().splitlines()[-1])
        seq_wall, seq_failed = launch(Path(single), 1, args.jobs * args.runs)
        print(f"1 process x {args.jobs * args.runs} runs: {seq_wall:.1f} s wall; runs by status {count(Path(single))}; "
              f"failed {len(seq_failed)}")


if __name__ == "__main__":
    main()
