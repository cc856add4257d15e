"""The report's slow sections (bootstrap intervals, gains on the paper's terms) on a real-looking run and a
degenerate one (every label and confidence 0), so the two can be compared: issue 42 found the degenerate run
7x slower (relplot's narrowest-kernel search on rows whose residuals are all 0).

    python benchmarks/report_degenerate.py [--calls 200] [--rows 7]

Synthetic predictions, no MLflow: what is timed is the arithmetic the report does per Table-1 block.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd

from mice_exp.metrics.bootstrap import bootstrap_intervals
from mice_exp.report.intervals import RESAMPLES, ROWS_METRICS, TABLE_METRICS
from mice_exp.report.paper_terms import paper_terms

ROWS = ["Raw Confidence", "HRE", "NWKR", "MICE LR", "MICE RF", "MICE LR Zeroshot", "MICE RF Zeroshot"]


def block(kind: str, calls: int, rows: int, rng: np.random.Generator) -> pd.DataFrame:
    """One LLM's Table-1 rows as the report reads them (long predictions)."""
    y = rng.integers(0, 2, calls) if kind == "real" else np.zeros(calls, dtype=int)
    frames = []
    for name in ROWS[:rows]:
        p = np.clip(0.6 * y + 0.4 * rng.random(calls), 0, 1) if kind == "real" else np.zeros(calls)
        frames.append(pd.DataFrame({"table": "table1", "dataset": "ste", "llm": "x", "row": name,
                                    "estimator": name.lower().replace(" ", "_"), "protocol": "holdout",
                                    "features": "bertscore", "run_id": name, "id": np.arange(calls), "api": "a",
                                    "confidence": p, "label": y}))
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="test calls per row")
    parser.add_argument("--rows", type=int, default=len(ROWS), help="Table-1 rows")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"load before: {os.getloadavg()[0]:.2f}")
    for kind in ("real", "degenerate"):
        long = block(kind, args.calls, args.rows, rng)
        start = time.perf_counter()
        paper_terms(long)
        for _, row in long.groupby("row"):
            bootstrap_intervals(row["confidence"].to_numpy(), row["label"].to_numpy(), TABLE_METRICS, RESAMPLES,
                                rows_metrics=ROWS_METRICS)
        print(f"{kind}: {time.perf_counter() - start:.1f} s ({args.rows} rows x {args.calls} calls)")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
