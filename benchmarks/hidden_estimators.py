"""Fit time and test AUROC of the hidden-state baselines at SmolLM2-135M's shapes (synthetic states).

    python benchmarks/hidden_estimators.py

400 training and 200 test calls (about the 750 STE calls' split), 30 layers of 576 dimensions,
Gaussian noise with a weak signal (8 dimensions shifted by +-0.6) in layer 20 only: the final-layer
probe and Mahalanobis should sit near chance, the best-layer probe should find layer 20.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mice_exp.estimators import BestLayerProbe, LinearProbe, MahalanobisConfidence  # noqa: E402
from mice_exp.estimators.blocks import layers  # noqa: E402
from mice_exp.metrics import auroc  # noqa: E402

N_TRAIN, N_TEST, LAYERS, DIM, SIGNAL_LAYER = 400, 200, 30, 576, 20


def main() -> None:
    rng = np.random.default_rng(0)
    n = N_TRAIN + N_TEST
    y = (rng.random(n) < 0.5).astype(int)
    states = rng.normal(size=(n, LAYERS, DIM))
    states[:, SIGNAL_LAYER - 1, :8] += 0.6 * (2 * y[:, None] - 1)
    X = layers(states)  # columns named by layer: the estimators learn the 30 layers from them
    for estimator in (LinearProbe(), BestLayerProbe(), MahalanobisConfidence()):
        start = time.perf_counter()
        estimator.fit(X.iloc[:N_TRAIN], y[:N_TRAIN])
        seconds = time.perf_counter() - start
        p = estimator.predict_proba(X.iloc[N_TRAIN:])[:, 1]
        layer = f"  chosen layer {estimator.layer_}" if hasattr(estimator, "layer_") else ""
        print(f"{type(estimator).__name__:<22} fit {seconds:6.2f} s  test AUROC {auroc(p, y[N_TRAIN:]):.3f}{layer}")


if __name__ == "__main__":
    main()
