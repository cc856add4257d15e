"""One LLM stage on many workers (``llm.shards=N``), into the same cache folder, with the same records.

The stage's batches are fixed by (prompt length, id) order, so which worker computes a batch does not
change it: batch n belongs to worker n % N (interleaved, so every worker gets long and short prompts
alike). A worker computes only its own missing batches, under its own lock, so N of them run at once;
whichever finds every batch complete writes ``done.json``, and the records read from the folder are
a one-worker run's.

``llm.shard=i`` runs worker i alone (a Slurm array task, a job of any scheduler). Without it,
:func:`run_workers` starts the N workers as local processes (:mod:`mice_exp.llm.shard_worker`), each
on its share of the cores and, on CUDA, of the visible GPUs.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tqdm.auto import tqdm

from mice_exp.cache import write_json
from mice_exp.devices import ENV_VAR, describe_exit, visible_gpus
from mice_exp.errors import UserError, expect
from mice_exp.llm.records import shard_name, shards
from mice_exp.llm.settings import LLMSettings
from mice_exp.paths import Paths

log = logging.getLogger(__name__)
POLL_S = 0.5  # seconds between two looks at the workers' finished batches


@dataclass(frozen=True)
class ShardPlan:
    """Which of a stage's ``batches`` one process computes: worker ``worker`` of ``count``'s, or (``worker``
    None) every batch, itself when ``count`` is 1, through ``count`` local workers otherwise."""

    count: int
    worker: int | None
    batches: int

    @classmethod
    def from_config(cls, llm: LLMSettings, n_examples: int) -> ShardPlan:
        """``llm.shards`` / ``llm.shard`` for a stage of ``n_examples`` calls (their ranges are config checks)."""
        count, size = int(llm.shards), int(llm.batch_size)
        total = -(-n_examples // size)
        expect(count <= total, f"llm.shards={count} is more than the stage's {total} batches ({n_examples} calls, "
                               f"llm.batch_size={size}); expected llm.shards <= {total}: fewer shards or a smaller "
                               "llm.batch_size")
        return cls(count=count, worker=llm.shard, batches=total)

    @property
    def launches(self) -> bool:
        """This process starts the local workers rather than computing batches itself."""
        return self.worker is None and self.count > 1

    def owns(self, batch: int) -> bool:
        return self.worker is None or batch % self.count == self.worker

    def unfinished(self, out: Path) -> list[int]:
        """The workers with a batch still missing in ``out`` (worker 0 alone when only ``done.json`` is:
        it writes it), so a re-run starts only those."""
        missing = [n for n in range(self.batches) if not (out / f"{shard_name(n, self.batches)}.jsonl").exists()]
        return sorted({n % self.count for n in missing}) or [0]

    @property
    def lock(self) -> str:
        """The lock file this process holds while computing: one per worker, so the workers run at once."""
        return ".lock" if self.worker is None else f".lock-shard-{self.worker}-of-{self.count}"


def worker_threads(count: int) -> int:
    """The threads each of ``count`` local workers gets: this process's cores (its affinity where the
    system has one, as under Slurm or taskset) shared out, at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // count)


def run_workers(settings: Mapping[str, Any], llm: LLMSettings, paths: Paths, out: Path, plan: ShardPlan) -> None:
    """Compute the stage in ``out`` with ``plan.count`` local worker processes at once, each with its share of
    the cores and, when the LLM (``llm``) runs on CUDA, one of the visible GPUs (round robin), showing the stage's
    progress; ``settings``: the stage's config groups (:meth:`mice_exp.llm.stage.LLMStage.settings`), each
    worker's start.

    Finished batches stay whatever happens, so a re-run resumes; a worker that fails is named in one line
    with its log (``out/workers/worker-i-of-N.log``).
    """
    folder = out / "workers"
    spec = folder / "config.json"
    write_json(spec, {"stage": settings, "root": str(paths.root), "cache": str(paths.cache)})
    threads = str(worker_threads(plan.count))
    gpus = visible_gpus() if llm.device in ("cuda", "auto") else []
    workers = plan.unfinished(out)
    logs = {i: folder / f"worker-{i}-of-{plan.count}.log" for i in workers}
    log.info("computing the LLM stage in %s with %d of its %d workers as local processes, %s threads each%s; logs "
             "in %s", out, len(workers), plan.count, threads, f", on GPUs {','.join(gpus)}" if gpus else "", folder)
    procs: dict[int, subprocess.Popen] = {}
    try:
        for i, path in logs.items():
            env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TQDM_DISABLE="1")
            if gpus:
                env[ENV_VAR] = gpus[i % len(gpus)]
            with open(path, "wb") as handle:
                procs[i] = subprocess.Popen([sys.executable, "-m", "mice_exp.llm.shard_worker", str(spec), str(i)],
                                            stdout=handle, stderr=subprocess.STDOUT, env=env)
        with tqdm(total=plan.batches, initial=len(shards(out)), desc=f"LLM {llm.name} x{plan.count}",
                  unit="batch") as bar:
            while any(p.poll() is None for p in procs.values()):
                time.sleep(POLL_S)
                bar.update(len(shards(out)) - bar.n)
    finally:  # Ctrl-C or an error here: no worker outlives the stage
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
            p.wait()
    failed = [f"worker {i} of {plan.count} ({describe_exit(p.returncode)}{_last_words(logs[i], p.returncode)}; "
              f"log {logs[i]})" for i, p in procs.items() if p.returncode != 0]
    if failed:
        raise UserError(f"LLM stage: {'; '.join(failed)} failed; {len(shards(out))} of {plan.batches} batches are "
                        f"kept in {out}, and the same command resumes from them")


def _last_words(path: Path, code: int) -> str:
    """``: <the log's last line>`` for a worker that exited with an error (its one-line error or the
    traceback's last line); nothing for one killed by a signal, whose log ends wherever it was."""
    lines = path.read_text(errors="replace").strip().splitlines() if code > 0 else []
    return f": {lines[-1][:300]}" if lines else ""
