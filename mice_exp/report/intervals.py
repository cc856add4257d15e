"""95% bootstrap intervals for every Table 1 / Table 2 cell, from the runs' test predictions."""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from mice_exp.metrics import PAPER_RISKS
from mice_exp.metrics.bootstrap import bootstrap_intervals
from mice_exp.metrics.registry import metric
from mice_exp.report.plots import PredictionsFn, prediction_pair
from mice_exp.report.tables import METRICS

#: Table metric -> f(p, y), the functions the job logged the cell's value with (at the paper's risks).
TABLE_METRICS = {m: metric(m).at(PAPER_RISKS) for m in METRICS}
ROWS_METRICS = {m: rows for m in METRICS if (rows := metric(m).rows_at(PAPER_RISKS)) is not None}
RESAMPLES = 200


def interval_columns() -> list[str]:
    return [f"{m}_{end}" for m in METRICS for end in ("lo", "hi")]


def add_intervals(table: pd.DataFrame, predictions: PredictionsFn, n_resamples: int = RESAMPLES) -> pd.DataFrame:
    """``table`` with ``<metric>_lo`` / ``<metric>_hi`` columns (NaN where a run kept no predictions)."""
    table = table.copy()
    for column in interval_columns():
        table[column] = np.nan
    for index, row in tqdm(table.iterrows(), total=len(table), desc="report: bootstrap intervals", unit="row"):
        pair = prediction_pair(predictions(row["run_id"]), row["estimator"])
        if pair is None:
            continue
        intervals = bootstrap_intervals(*pair, TABLE_METRICS, n_resamples, rows_metrics=ROWS_METRICS)
        for metric, (low, high) in intervals.items():
            table.loc[index, [f"{metric}_lo", f"{metric}_hi"]] = low, high
    return table
