"""What smECE's significance tests and bootstrap intervals cost, relplot one vector at a time against
:func:`mice_exp.metrics.smece_rows` (rows scored together), in one process on the same inputs.

Cases: 12 test calls (``make run``) and 200 (the full STE test split); a pair of estimators
that differs and one that does not (the test draws until its p is on one side of 0.05);
200 bootstrap resamples of one row of a table. Prints the CPU, its load and both timings.

    .venv/bin/python benchmarks/smooth_ece.py
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import relplot
import torch

from mice_exp.metrics import ALPHA, permutation_test, smece, smece_rows
from mice_exp.metrics.bootstrap import bootstrap_intervals


def pair(n: int, differ: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels, an informative confidence, and either a random one or a second draw of the first."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.6).astype(int)

    def informed() -> np.ndarray:
        return np.clip(0.55 + 0.6 * (y - 0.5) + rng.normal(0, 0.15, n), 0, 1)

    return y, informed(), rng.random(n) if differ else informed()


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    print(f"cpu: {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores; "
          f"load average at start {os.getloadavg()[0]:.2f}; numpy threads as configured (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')})")
    negated = (lambda p, y: -smece(p, y)), (lambda p, y: -smece_rows(p, y))
    for n in (12, 200):
        for label, differ in (("differ", True), ("alike", False)):
            y, a, b = pair(n, differ)
            t_one, one = timed(lambda: permutation_test(negated[0], a, b, y, alpha=ALPHA))
            t_rows, rows = timed(lambda: permutation_test(negated[0], a, b, y, alpha=ALPHA, rows_metric=negated[1]))
            assert one == rows, (one, rows)
            print(f"n={n:>3} pair that {label:<6}: permutation test (p = {one.p_value:.4f}): relplot {t_one:6.2f} s, "
                  f"smece_rows {t_rows:5.2f} s ({t_one / t_rows:4.1f}x)")
        y, a, _ = pair(n, True)
        t_one, one = timed(lambda: bootstrap_intervals(a, y, {"smece": smece}))
        t_rows, rows = timed(lambda: bootstrap_intervals(a, y, {"smece": smece}, rows_metrics={"smece": smece_rows}))
        assert np.allclose(one["smece"], rows["smece"], rtol=1e-9), (one, rows)
        print(f"n={n:>3} 200 bootstrap resamples: relplot {t_one:6.2f} s, smece_rows {t_rows:5.2f} s "
              f"({t_one / t_rows:4.1f}x)")
    rng = np.random.default_rng(1)
    p = rng.random((500, 200))
    y = (rng.random((500, 200)) < p).astype(float)
    gap = np.abs(smece_rows(p, y) - [relplot.smECE(a, b) for a, b in zip(p, y)]).max()
    print(f"largest |smece_rows - relplot.smECE| over 500 random rows of 200: {gap:.1e}")
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
