"""The paper from scratch, timed: one LLM's whole records and every preset built from them, per ``llm.backend``.

For each backend (``hf``, ``vllm``), in a cache of its own (the model folders shared), the same commands
``experiments/records/regenerate.sh`` runs, then every preset on the records:

1. ``stage``: the LLM stage (generation with capture, labels) on the selected STE calls;
2. ``sources``: P(True), verbalized confidence and the way-out prompt;
3. ``samples``: self-consistency's k = 10 samples and their semantic entropy (test calls);
4. one ``mice-exp -m +experiment=<preset> llm.records=...`` per preset (its hidden states replayed on the
   same backend where the preset reads them).

Each step is a subprocess under ``/usr/bin/time`` (wall, user + system CPU, peak resident memory of the
step's largest process). Printed: a table of steps x backends and the ratio to ``hf``, and whether the two
backends' records give every call the same label (and how many calls the same generated tokens).

    .venv-vllm/bin/python benchmarks/reproduce.py [--llm smollm2_135m] [--apis 3] [--backends hf,vllm]
    .venv-vllm/bin/python benchmarks/reproduce.py --apis all --backends vllm     # all 750 calls (hours on a CPU)

    .venv-vllm/bin/python benchmarks/reproduce.py --llm tiny_random --presets table1 \\
        llm.source.architecture.num_attention_heads=1 llm.source.architecture.num_key_value_heads=1  # a check

``--apis 3`` is the 45-call subset (``+scale=small``'s); ``--presets`` picks presets (default: all of
``conf/experiment``). Run it on a quiet machine (load average < 1.5, printed at the start and the end) from a
venv that has vLLM (``make vllm``); ``--json FILE`` keeps the figures, rewritten after every step.

``--resume`` keeps each backend's folder and the steps it finished (``figures.json`` there: each step's figures
with its CPU, load and time), for a run longer than a session (all 750 calls): a step that was cut off is rolled
back first (every file it added removed; one it changed in place refuses the resume) and runs again whole, so
every step's figure is one uninterrupted run; the total is then a sum of steps timed at different times, which
the table says.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from sklearn.metrics import roc_auc_score

from cputime import cpu_line  # benchmarks/, the script's own folder
from mice_exp.llm.records import read_records_file

ROOT = Path(__file__).resolve().parents[1]
PRESETS = tuple(sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")))
#: The records steps (``experiments/records/regenerate.sh``), as ``mice-exp`` arguments; {out}: the records file.
RECORDS = (("stage", ["records", "output={out}", "force=true"]),
           ("sources", ["records", "llm.records={out}", "sources.use=[p_true,verbalized,acts]", "output={out}"]),
           ("samples", ["records", "llm.records={out}", "sources.use=[consistency,semantic_entropy]",
                        "sources.consistency.splits=[test]", "output={out}"]))
SOURCES = ("p_true", "verbalized", "acts", "consistency", "semantic_entropy")
BOOKKEEPING = ("figures.json", "pending.json", "log.txt")
TIME = re.compile(r"^reproduce-time wall (\S+) user (\S+) sys (\S+) rss (\S+)$", re.M)


def files(folder: Path) -> dict[str, list[int]]:
    """Every file under ``folder`` (links not followed: the shared model folder is not the run's) but the run's
    own bookkeeping, with its size and modification time."""
    found = {}
    for top, _, names in os.walk(folder):
        for name in names:
            path = Path(top) / name
            if name not in BOOKKEEPING and not path.is_symlink():
                found[str(path.relative_to(folder))] = [path.stat().st_size, path.stat().st_mtime_ns]
    return found


def start_step(folder: Path, step: str) -> None:
    """Note the files before ``step`` runs, so that a resume can undo it if it is cut off (:func:`roll_back`)."""
    (folder / "pending.json").write_text(json.dumps({"step": step, "files": files(folder)}))


def roll_back(folder: Path, finished: Sequence[str]) -> None:
    """Undo the step a resumed run was cut off in (``pending.json``: the files before it): what it added goes;
    a file it changed in place cannot be undone, and the resume stops saying so. A step among ``finished`` was
    cut off after its figures were kept, and keeps what it made."""
    pending = folder / "pending.json"
    if not pending.exists():
        return
    before = json.loads(pending.read_text())
    if before["step"] in finished:
        pending.unlink()
        return
    now = files(folder)
    changed = sorted(f for f, stat in before["files"].items() if now.get(f) != stat)
    if changed:
        sys.exit(f"reproduce --resume: step {before['step']!r} was cut off after changing {changed[0]} in {folder}; "
                 "expected only new files; run again without --resume")
    for name in set(now) - set(before["files"]):
        (folder / name).unlink()
    pending.unlink()
    print(f"  rolled back the cut-off step {before['step']!r} in {folder}", flush=True)


def steps(presets: list[str]) -> list[tuple[str, list[str]]]:
    return [*RECORDS, *((p, ["-m", f"+experiment={p}", "llm.records={out}"]) for p in presets)]


def run_step(args: list[str], log: Path) -> dict[str, float]:
    """One ``mice-exp`` command under ``/usr/bin/time``; its output appended to ``log``."""
    command = ["/usr/bin/time", "-f", "reproduce-time wall %e user %U sys %S rss %M", sys.executable, "-m", "mice_exp",
               *args]
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command[3:])}\n")
        out.flush()
        done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False)
    found = TIME.findall(log.read_text())
    if done.returncode or not found:
        sys.exit(f"reproduce: `mice-exp {' '.join(args)}` failed (exit {done.returncode}); its output: {log}")
    wall, user, system, rss = (float(v) for v in found[-1])
    return {"wall_s": wall, "cpu_s": user + system, "peak_rss_gib": rss / 2**20}


def records(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in read_records_file(path).with_sources()}


def sameness(first: Path, second: Path) -> dict[str, int]:
    """Calls of two backends' records: how many, with the same label, with the same generated tokens."""
    a, b = records(first), records(second)
    ids = sorted(set(a) & set(b))
    return {"calls": len(ids), "only_one": len(set(a) ^ set(b)),
            "same_label": sum(a[i]["label"] == b[i]["label"] for i in ids),
            "same_tokens": sum(a[i]["token_ids"] == b[i]["token_ids"] for i in ids)}


def interval(values: np.ndarray, labels: np.ndarray, draws: int = 1000) -> list[float]:
    """The AUROC of ``values`` against ``labels`` with a 95% percentile bootstrap interval over calls (resamples
    of one class skipped; nan where the labels have one class)."""
    if len(set(labels)) < 2:
        return [float("nan")] * 3
    rng = np.random.default_rng(0)
    picks = (rng.integers(0, len(values), len(values)) for _ in range(draws))
    samples = [roc_auc_score(labels[i], values[i]) for i in picks if len(set(labels[i])) == 2]
    low, high = np.percentile(samples, [2.5, 97.5])
    return [float(roc_auc_score(labels, values)), float(low), float(high)]


def source_agreement(first: Path, second: Path, names: Sequence[str] = SOURCES) -> dict[str, dict[str, object]]:
    """Each confidence source of two backends' records on the calls both scored: P(True)'s largest difference,
    how many greedy answers (verbalized, way-out) are equal, and the sampled sources as distributions (mean,
    AUROC against the first file's labels with bootstrap intervals; ``semantic_entropy`` is stored as a
    confidence, 1 - the normalised entropy; seeded samples differ by engine)."""
    a, b = records(first), records(second)
    out: dict[str, dict[str, object]] = {}
    for name in names:
        ids = sorted(i for i in set(a) & set(b) if name in (a[i].get("sources") or {})
                     and name in (b[i].get("sources") or {}))
        if not ids:
            continue
        x = np.array([a[i]["sources"][name] for i in ids], dtype=float)
        y = np.array([b[i]["sources"][name] for i in ids], dtype=float)
        labels = np.array([a[i]["label"] for i in ids])
        if name in ("consistency", "semantic_entropy"):  # scored on the sampled (test) calls only
            both = np.isfinite(x) & np.isfinite(y)
            x, y, labels = x[both], y[both], labels[both]
            ids = [i for i, keep in zip(ids, both) if keep]
        if name == "p_true":
            out[name] = {"calls": len(ids), "max_abs_difference": float(np.nanmax(np.abs(x - y)))}
        elif name in ("verbalized", "acts"):
            out[name] = {"calls": len(ids), "equal": int(np.sum((x == y) | (np.isnan(x) & np.isnan(y))))}
        else:
            out[name] = {"calls": len(ids), "mean": [float(np.nanmean(x)), float(np.nanmean(y))],
                         "auroc": [interval(x, labels), interval(y, labels)]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llm", default="smollm2_135m")
    parser.add_argument("--apis", default="3", help="the first N STE APIs (3: 45 calls), or 'all' (750)")
    parser.add_argument("--backends", default="hf,vllm")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--dir", type=Path, default=ROOT / ".cache" / "reproduce",
                        help="each backend's cache, records, multirun folders and log (emptied first but with --resume)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--resume", action="store_true", help="keep the finished steps of an earlier run (--dir)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every step (e.g. a tiny model's shape)")
    args = parser.parse_args()
    backends, presets = args.backends.split(","), [p for p in args.presets.split(",") if p]
    unknown = sorted(set(presets) - set(PRESETS))
    if unknown:
        sys.exit(f"--presets: {', '.join(unknown)} not in conf/experiment; expected some of {', '.join(PRESETS)}")
    if args.apis != "all" and not args.apis.isdigit():
        sys.exit(f"--apis={args.apis!r}: expected a number of STE APIs or 'all'")
    scale = [] if args.apis == "all" else ["+scale=small", f"dataset.max_apis={args.apis}"]
    cpu = cpu_line()
    print(f"{args.llm}, STE APIs {args.apis}; {cpu}; load average at start {os.getloadavg()}", flush=True)
    figures: dict[str, dict[str, dict[str, float]]] = {}
    for backend in backends:
        folder = args.dir / backend
        done = folder / "figures.json"
        if args.resume and done.exists():
            roll_back(folder, list(json.loads(done.read_text())))
        else:
            shutil.rmtree(folder, ignore_errors=True)
            (folder / "cache").mkdir(parents=True)
            (folder / "cache" / "models").symlink_to(ROOT / ".cache" / "models")
            done.write_text("{}\n")
        out = folder / "records.jsonl.gz"
        common = [f"llm={args.llm}", f"llm.backend={backend}", f"paths.cache={folder / 'cache'}",
                  f"hydra.sweep.dir={folder / 'multirun'}", "tracking.enabled=false", *scale, *args.overrides]
        figures[backend] = json.loads(done.read_text())
        for name, step in steps(presets):
            print(f"  {backend:5s} {name:18s}", end="", flush=True)
            if name in figures[backend]:
                print(f" {figures[backend][name]['wall_s']:9.1f} s (timed {figures[backend][name]['at']})", flush=True)
                continue
            start_step(folder, name)
            started, load = time.perf_counter(), os.getloadavg()[0]
            for_preset = [] if step[0] == "records" else [f"hydra.sweep.subdir={name}/${{hydra.job.num}}"]
            figures[backend][name] = {**run_step([a.format(out=out) for a in step] + common + for_preset,
                                                 folder / "log.txt"),
                                      "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu,
                                      "load": [round(load, 2), round(os.getloadavg()[0], 2)]}
            done.write_text(json.dumps(figures[backend], indent=2) + "\n")
            (folder / "pending.json").unlink()
            print(f" {time.perf_counter() - started:9.1f} s", flush=True)
            if args.json:
                args.json.write_text(json.dumps({"llm": args.llm, "apis": args.apis, "cpu": cpu, "figures": figures},
                                                indent=2) + "\n")
    print(f"load average at end {os.getloadavg()}")
    times = sorted(f["at"] for b in backends for f in figures[b].values())
    print(f"steps timed from {times[0]} to {times[-1]}" + (" (resumed: the total sums steps timed apart)\n"
                                                          if args.resume else "\n"))
    names = [name for name, _ in steps(presets)]
    print(f"{'step':18s}" + "".join(f"{b:>12s}" for b in backends) + "".join(f"{b + '/' + backends[0]:>12s}"
                                                                             for b in backends[1:]))
    for name in [*names, "total"]:
        walls = [sum(f["wall_s"] for f in figures[b].values()) if name == "total" else figures[b][name]["wall_s"]
                 for b in backends]
        print(f"{name:18s}" + "".join(f"{w:11.1f}s" for w in walls) + "".join(f"{w / walls[0]:11.2f}x"
                                                                              for w in walls[1:]))
    print("peak RSS " + ", ".join(f"{b} {max(f['peak_rss_gib'] for f in figures[b].values()):.2f} GiB"
                                  for b in backends))
    same = {b: sameness(args.dir / backends[0] / "records.jsonl.gz", args.dir / b / "records.jsonl.gz")
            for b in backends[1:]}
    for b, s in same.items():
        print(f"{b} against {backends[0]}: {s['same_label']} / {s['calls']} calls with the same label, "
              f"{s['same_tokens']} with the same tokens ({s['only_one']} in one file only)")
        s["sources"] = source_agreement(args.dir / backends[0] / "records.jsonl.gz", args.dir / b / "records.jsonl.gz")
        for name, found in s["sources"].items():
            print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    if args.json:
        args.json.write_text(json.dumps({"llm": args.llm, "apis": args.apis, "cpu": cpu, "figures": figures,
                                         "sameness": same}, indent=2) + "\n")


if __name__ == "__main__":
    main()
