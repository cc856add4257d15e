"""Wall time of the MICE §6 sample-efficiency grid (Figure 7), and the speedup of its parallel loop.

Data: a synthetic FeatureSet shaped like STE features for a 32-layer Llama3 -- 750 examples,
29 BERTScore-like columns (layers 1..29, rising with depth, correlated across layers, slightly
higher on correct calls in later layers) + the raw confidence (overconfident, informative);
about 60 % of calls correct, with a per-API difficulty. Splits per API (50 APIs x 15 examples):
8 training rows (STE's 8 per API x 50 APIs = 400 training rows) and 7 test rows (350). With 400
training rows the paper's sizes 500 and 750 are skipped (warned); 300 gives a single group.

Grid: MICE LR and MICE RF from conf/estimator (RF: 1000 trees, depth 20, 10 features; n_jobs
forced to 1 inside tasks), the paper's sizes and 100 trials, n_jobs=-1 (all cores of this
machine). In the SAME run, the sequential loop (n_jobs=1, one process) is timed on the first
``--seq-trials`` trials and extrapolated linearly to all trials (trials are identical in cost
distribution: same sizes, same group counts); the parallel loop is also timed on those same
first trials for a like-for-like figure, and its scores are checked equal to the sequential ones.

    .venv/bin/python benchmarks/sample_efficiency.py [--trials 100] [--seq-trials 5] [--n-jobs -1]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
from scipy.special import expit

from cputime import cpu_seconds  # benchmarks/, the script's own folder
from mice_exp.compose import as_plain, compose_config
from mice_exp.estimation import Study
from mice_exp.features import FeatureSet
from mice_exp.protocols.sample_efficiency import (
    PAPER_SIZES,
    sample_efficiency_figure,
    sample_efficiency_scores,
    summarise,
)

N_APIS, TRAIN_PER_API, TEST_PER_API, N_LAYERS = 50, 8, 7, 30  # 29 BERTScore features (layers 1..29)


def synthetic_ste(seed: int = 0) -> FeatureSet:
    """750 STE-like examples: 400 train (8 per API), 350 test (7 per API); 29 BERTScores + confidence."""
    rng = np.random.default_rng(seed)
    per_api = TRAIN_PER_API + TEST_PER_API
    n = N_APIS * per_api
    api = np.repeat(np.arange(N_APIS), per_api)
    split = np.tile(["train"] * TRAIN_PER_API + ["test"] * TEST_PER_API, N_APIS)
    skill = rng.normal(0.0, 0.8, N_APIS)[api] + rng.normal(size=n)  # how easy the call is
    labels = (skill + 0.8 * rng.normal(size=n) > -0.35).astype(int)  # ~60 % correct
    confidence = expit(2.0 + 1.2 * skill + 0.8 * rng.normal(size=n))  # overconfident, informative
    depth = np.arange(1, N_LAYERS) / (N_LAYERS - 1)
    noise = np.empty((n, N_LAYERS - 1))  # AR(1) across layers: neighbouring layers agree
    noise[:, 0] = rng.normal(size=n)
    for j in range(1, N_LAYERS - 1):
        noise[:, j] = 0.8 * noise[:, j - 1] + 0.6 * rng.normal(size=n)
    scores = (0.35 + 0.5 * depth**2 + 0.04 * depth**2 * (labels[:, None] - 0.5) * 2
              + 0.02 * skill[:, None] * depth + 0.04 * noise)
    scores = np.clip(scores, 0.0, 1.0)
    X = np.column_stack([scores, confidence])
    columns = [f"bertscore_L{i}" for i in range(1, N_LAYERS)] + ["confidence"]
    return FeatureSet(ids=[f"ex{i}" for i in range(n)], apis=np.array([f"api{a}" for a in api]), splits=split,
                      labels=labels, confidence=confidence, X=X, columns=columns, layer_scores=scores)


def timed(label: str, **kwargs) -> tuple[pd.DataFrame, float, float]:
    """Scores, wall seconds and CPU seconds (all processes of ours) of one grid."""
    cpu, start = cpu_seconds(), time.perf_counter()
    scores = sample_efficiency_scores(**kwargs)
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    print(f"{label:<44} wall {wall:8.1f} s   CPU {cpu:8.1f} s   cores used {cpu / wall:4.2f}   "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    return scores, wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seq-trials", type=int, default=5)
    parser.add_argument("--n-jobs", type=int, default=-1)
    parser.add_argument("--figure", default="outputs/benchmarks/sample_efficiency.png")
    args = parser.parse_args()

    fs = synthetic_ste()
    study = Study.from_config(as_plain(compose_config(["protocol=sample_efficiency"])))
    candidates = [study.candidate(key, "protocol.estimators") for key in ("mice_lr", "mice_rf")]
    estimators, names = {c.key: c.estimator for c in candidates}, {c.key: c.name for c in candidates}
    train = fs.rows("train")
    print(f"synthetic STE: {len(fs.ids)} examples x {fs.X.shape[1]} features "
          f"({fs.X.shape[1] - 1} BERTScore-like + confidence); {train.sum()} train "
          f"({TRAIN_PER_API} per API x {N_APIS} APIs), {fs.rows('test').sum()} test; "
          f"accuracy {fs.labels.mean():.2f}")
    print(f"estimators: {', '.join(names.values())}; sizes {list(PAPER_SIZES)}; {os.cpu_count()} CPUs; "
          f"load average at start {os.getloadavg()[0]:.1f}", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the oversize-skip warning; reported below instead
        common = dict(estimators=estimators, fs=fs, sizes=PAPER_SIZES, seed=0)
        seq, seq_wall, seq_cpu = timed(f"sequential loop, {args.seq_trials} trials (n_jobs=1)",
                              trials=args.seq_trials, n_jobs=1, **common)
        par_few, par_few_wall, par_few_cpu = timed(f"parallel, {args.seq_trials} trials (n_jobs={args.n_jobs})",
                                      trials=args.seq_trials, n_jobs=args.n_jobs, **common)
        full, full_wall, full_cpu = timed(f"parallel, {args.trials} trials (n_jobs={args.n_jobs})",
                                trials=args.trials, n_jobs=args.n_jobs, **common)
    skipped = [s for s in PAPER_SIZES if s > train.sum()]
    print(f"skipped sizes (larger than {train.sum()} training rows): {skipped}")
    same = seq.equals(par_few) and seq.equals(full[full.trial < args.seq_trials].reset_index(drop=True))
    print(f"parallel scores == sequential scores on the first {args.seq_trials} trials: {same}")
    fits = len(full)
    seq_full = seq_wall * args.trials / args.seq_trials
    print(f"\nfull grid: {fits} fits ({fits // len(estimators)} (trial, group) tasks x {len(estimators)} estimators)")
    print(f"  parallel wall time, {args.trials} trials:             {full_wall:9.1f} s ({full_wall / 60:.1f} min)")
    print(f"  sequential, extrapolated from {args.seq_trials} trials x {args.trials // args.seq_trials}: "
          f"{seq_full:9.1f} s ({seq_full / 60:.1f} min)")
    print(f"  speedup, full grid (extrapolated sequential):    {seq_full / full_wall:9.2f}x")
    print(f"  speedup, same {args.seq_trials} trials measured both ways:     {seq_wall / par_few_wall:9.2f}x "
          "(parallel includes worker start-up)")
    workers = joblib.effective_n_jobs(args.n_jobs)
    per_trial_seq, per_trial_par = seq_cpu / args.seq_trials, full_cpu / args.trials
    print(f"  CPU per trial: sequential {per_trial_seq:.1f} s, parallel {per_trial_par:.1f} s "
          f"(work overhead of the parallel loop {per_trial_par / per_trial_seq - 1:+.1%})")
    print(f"  cores obtained: sequential {seq_cpu / seq_wall:.2f} of 1, parallel {full_cpu / full_wall:.2f} "
          f"of {workers} (the machine is shared: see load averages)")
    print(f"  speedup if every worker got a full core: {workers * per_trial_seq / per_trial_par:.2f}x "
          f"(= {workers} workers x CPU ratio; ignores the tail where fewer tasks than workers remain)")
    table = summarise(full)
    with pd.option_context("display.width", 160, "display.precision", 4):
        print("\n" + table.to_string(index=False))
    path = Path(args.figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = sample_efficiency_figure(table, labels=names, title="Sample efficiency, synthetic STE-like data")
    figure.savefig(path, dpi=120)
    print(f"\nfigure: {path}")


if __name__ == "__main__":
    main()
