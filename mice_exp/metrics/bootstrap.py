"""Percentile bootstrap intervals of a metric over test calls (resampled with replacement).

With 200 test calls a table cell's value moves by several hundredths between resamples; the
interval says which differences in a table mean something before any significance mark does.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from mice_exp.metrics.permutation import Metric, RowsMetric
from mice_exp.metrics.validation import check_pair


def bootstrap_intervals(p: np.ndarray, y: np.ndarray, metrics: Mapping[str, Metric], n_resamples: int = 200,
                        level: float = 0.95, seed: int = 0,
                        rows_metrics: Mapping[str, RowsMetric] | None = None) -> dict[str, tuple[float, float]]:
    """``{name: (low, high)}``: the ``level`` percentile interval of each metric over ``n_resamples``
    resamples of the (p, y) pairs; the same resamples serve every metric. NaN resamples (a
    single-class draw where a metric is undefined) are dropped; all NaN gives (nan, nan).
    ``rows_metrics`` gives a metric's form over all resamples at once (smECE's: ~10x faster)."""
    p, y = check_pair(p, y)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(y), size=(n_resamples, len(y)))
    tail = (1 - level) / 2 * 100
    rows_metrics = rows_metrics or {}
    out = {}
    for name, metric in metrics.items():
        if name in rows_metrics:
            values = np.asarray(rows_metrics[name](p[draws], y[draws]), dtype=float)
        else:
            values = np.array([metric(p[rows], y[rows]) for rows in draws], dtype=float)
        values = values[np.isfinite(values)]
        out[name] = (float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))) if len(values) \
            else (float("nan"), float("nan"))
    return out
