"""MICE RF prediction: sklearn's predict_proba (n_jobs=-1 and 1) against the all-trees walk the estimator uses.

A gate predicts one row per request; this times that (and a test split's 200 rows) on a saved gate's forest,
and checks that the walk gives sklearn's n_jobs=1 probabilities bit for bit.

    .venv/bin/python benchmarks/forest_predict.py [--gate experiments/abstention/gate-smollm2_135m] [--repeat 20]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from mice_exp.gate import Gate
from mice_exp.paths import PACKAGE_ROOT


def best_of(run, repeat: int) -> float:
    """The fastest of ``repeat`` runs (s): the least disturbed by anything else on the machine."""
    times = []
    for _ in range(repeat):
        tick = time.perf_counter()
        run()
        times.append(time.perf_counter() - tick)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gate", default=str(PACKAGE_ROOT / "experiments" / "abstention" / "gate-smollm2_135m"))
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(f"load average at start {os.getloadavg()}, {os.cpu_count()} cores")
    estimator = Gate.load(Path(args.gate)).estimator
    forest, walk = estimator.model_, estimator.walk_
    rng = np.random.default_rng(0)
    for rows in (1, 200):
        X = rng.random((rows, forest.n_features_in_))
        forest.set_params(n_jobs=1)
        assert np.array_equal(walk.predict_proba(X), forest.predict_proba(X)), "the walk differs from sklearn's"
        times = {"walk": best_of(lambda: walk.predict_proba(X), args.repeat)}
        for jobs in (1, -1):
            forest.set_params(n_jobs=jobs)
            times[f"sklearn n_jobs={jobs}"] = best_of(lambda: forest.predict_proba(X), args.repeat)
        print(f"{rows} rows, {len(forest.estimators_)} trees: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in
                                                                            times.items()) + "; walk = sklearn's bits")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
