"""Bootstrap intervals: they cover the point value, shrink with more calls, and follow the table's metrics."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mice_exp.metrics import auc_etcu, brier, smece, smece_rows
from mice_exp.metrics.bootstrap import bootstrap_intervals
from mice_exp.report.intervals import TABLE_METRICS, add_intervals
from mice_exp.report.tables import METRICS


def calls(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.6).astype(int)
    return np.clip(0.3 + 0.4 * y + rng.normal(0, 0.2, n), 0.01, 0.99), y


def test_an_interval_covers_the_value_and_narrows_with_more_calls():
    width = {}
    for n in (50, 800):
        p, y = calls(n)
        (low, high), = bootstrap_intervals(p, y, {"brier": brier}).values()
        assert low <= brier(p, y) <= high
        width[n] = high - low
    assert width[800] < width[50] / 2  # width ~ 1 / sqrt(n): 16x the calls, about a quarter of the width


def test_the_same_seed_gives_the_same_interval():
    p, y = calls(100)
    assert bootstrap_intervals(p, y, {"auc": auc_etcu}, seed=3) == bootstrap_intervals(p, y, {"auc": auc_etcu}, seed=3)


def test_smece_scored_over_all_resamples_at_once_gives_the_same_interval():
    p, y = calls(80)
    one_by_one = bootstrap_intervals(p, y, {"smece": smece}, n_resamples=60)["smece"]
    at_once = bootstrap_intervals(p, y, {"smece": smece}, n_resamples=60, rows_metrics={"smece": smece_rows})["smece"]
    np.testing.assert_allclose(at_once, one_by_one, rtol=1e-9)


def test_the_interval_columns_are_the_table_metrics():
    assert tuple(TABLE_METRICS) == METRICS


def test_a_row_without_predictions_keeps_nan_intervals():
    p, y = calls(60)
    table = pd.DataFrame({"run_id": ["a", "b"], "estimator": ["mice_rf", "hre"]})
    frames = {"a": pd.DataFrame({"p_mice_rf": p, "label": y}), "b": None}
    out = add_intervals(table, frames.get, n_resamples=50)
    assert out.loc[0, "auc_etcu_lo"] <= auc_etcu(p, y) <= out.loc[0, "auc_etcu_hi"]
    assert np.isnan(out.loc[1, [f"{m}_lo" for m in METRICS]].astype(float)).all()
