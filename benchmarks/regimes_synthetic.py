"""Full-size synthetic recovery of hidden miscalibration regimes (paper section 4, appendix E).

For the three-cluster set and the sinusoidal set (A = 0.6, k = 3), n = 10,000 split 80/10/10,
fit the field with the synthetic preset and the full (sigma, lambda) grid, then report the test
Pearson correlation with the true field, the selected hyperparameters, regime diagnostics and the
wall time of training phi on the 8,000 training points.

    .venv/bin/python benchmarks/regimes_synthetic.py                 # paper lr 3e-5, then 1e-3
    .venv/bin/python benchmarks/regimes_synthetic.py --lr 3e-5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import numpy as np

from mice_exp.estimators.field import regime_predictions
from mice_exp.regimes import SyntheticData, preset, regime_metrics, sinusoidal, three_clusters

DATASETS: dict[str, Callable[[int, int], SyntheticData]] = {
    "three_clusters": lambda n, seed: three_clusters(n=n, seed=seed),
    "sinusoidal_A0.6_k3": lambda n, seed: sinusoidal(n=n, seed=seed, amplitude=0.6, frequency=3),
}
REPORTED = ("worst_slice_gap", "field_std", "smece_all_base")
REGION_METHODS = [(r, m) for r in ("over", "under") for m in ("base", "iso", "ts", "field")]


def run(name: str, data: SyntheticData, lr: float, threads: int, progress: bool) -> dict[str, float | str]:
    model = preset("synthetic", lr=lr, num_threads=threads, progress=progress)
    start = time.perf_counter()
    model.fit(data.train.x, data.train.f, data.train.y, data.val.x, data.val.f, data.val.y)
    grid_seconds = time.perf_counter() - start
    diagnosis = regime_metrics(model.field(data.test.x), data.test.y, regime_predictions(model, data.train, data.test))
    seconds = np.array([h["seconds"] for h in model.history_])
    epochs = np.array([h["epochs"] for h in model.history_])
    selected = next(h for h in model.history_ if (h["sigma"], h["lambda"]) == (model.sigma_, model.lambda_))
    return {
        "dataset": name,
        "lr": lr,
        "n_train": len(data.train),
        "test_corr": float(np.corrcoef(model.field(data.test.x), data.true_field["test"])[0, 1]),
        "sigma": model.sigma_,
        "lambda": model.lambda_,
        "alpha": model.alpha_,
        "val_proxy": model.val_proxy_,
        "val_brier_raw": float(np.mean((data.val.y - data.val.f) ** 2)),
        "grid_size": len(model.history_),
        "grid_seconds": grid_seconds,
        "selected_fit_seconds": selected["seconds"],
        "selected_epochs": selected["epochs"],
        "selected_best_epoch": selected["best_epoch"],
        "seconds_per_epoch": float(seconds.sum() / epochs.sum()),
        "seconds_for_100_epochs": float(100 * seconds.sum() / epochs.sum()),
        **{k: diagnosis[k] for k in REPORTED},
        **{f"smece_{r}_{m}": diagnosis[f"smece_{r}_{m}"] for r, m in REGION_METHODS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0, help="data seed (the estimator seed stays 0)")
    parser.add_argument("--lr", type=float, nargs="+", default=[3e-5, 1e-3])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads while fitting")
    parser.add_argument("--progress", action="store_true", help="tqdm bars over the grid and epochs")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    print(f"cpus={os.cpu_count()} threads={args.threads} load_average={os.getloadavg()[0]:.2f} n={args.n}")
    results = []
    for name, make in DATASETS.items():
        data = make(args.n, args.seed)
        for lr in args.lr:
            result = run(name, data, lr, args.threads, args.progress)
            results.append(result)
            print(json.dumps({k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in result.items()}), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
