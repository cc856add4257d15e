"""Selective prediction beside calibration: Table 1's rows with smECE, AUC-ETCU, PRR and AURC.

Table 1 keeps the paper's layout; this second table asks of the same rows (same runs, same
reference rows) whether each estimator ranks the calls it should execute first
(:mod:`mice_exp.metrics.selective`). Runs logged before PRR and AURC existed show "–" there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from mice_exp.metrics import registry
from mice_exp.metrics.registry import metric
from mice_exp.report.collect import RunRecord
from mice_exp.report.tables import ID_COLUMNS, cell, rank_styles

SELECTIVE = "selective"
METRICS = registry.table_metrics(registry.SELECTIVE)
#: Beside PRR and AURC, Table 1's "AUC" would not say which curve.
HEADERS = {m: metric(m).header for m in METRICS} | {"auc_etcu": "AUC-ETCU (↑)"}
CAPTION = ("Selective prediction on Table 1's rows: PRR, the prediction-rejection ratio (1: oracle, 0: random "
           "rejection), and AURC, the area under the risk-coverage curve (Malinin et al.; Geifman et al.). "
           "**Bold**: best, <u>underline</u>: second best in each column for each model.")


def selective_table(table1: pd.DataFrame, records: Sequence[RunRecord]) -> pd.DataFrame:
    """One row per Table 1 row: its ids, the four metrics and their ``<m>_style`` per (dataset, LLM)."""
    by_id = {record.run_id: record.metrics for record in records}
    rows = []
    for row in table1.itertuples(index=False):
        prefix = f"baseline.{row.estimator}." if row.source == "baseline" else ""
        metrics = by_id.get(row.run_id, {})
        rows.append({"table": SELECTIVE, "dataset": row.dataset, "llm": row.llm, "llm_display": row.llm_display,
                     "row": row.row, "estimator": row.estimator, "protocol": row.protocol,
                     "features": row.features, "source": row.source, "run_id": row.run_id,
                     **{m: float(metrics.get(prefix + m, math.nan)) for m in METRICS}})
    frame = pd.DataFrame(rows, columns=[*ID_COLUMNS, *METRICS])
    blocks = frame.groupby(["dataset", "llm"], sort=False).groups.values()
    for m in METRICS:
        frame[f"{m}_style"] = ""
        lower_is_better = not metric(m).higher_is_better
        for index in blocks:
            frame.loc[index, f"{m}_style"] = rank_styles(frame.loc[index, m].tolist(), lower_is_better)
    return frame


def selective_markdown(frame: pd.DataFrame) -> str:
    """The table in Table 1's layout (model name on its block's first row) with its caption; "" if empty."""
    if frame.empty:
        return ""
    lines = ["## Selective prediction (Table 1's rows)", "",
             "| Model | Confidence Estimator | " + " | ".join(HEADERS[m] for m in METRICS) + " |",
             "|:---|:---|" + "---:|" * len(METRICS)]
    previous = None
    for row in frame.itertuples(index=False):
        model = row.llm_display if (row.dataset, row.llm) != previous else ""
        previous = (row.dataset, row.llm)
        cells = [cell(getattr(row, m), getattr(row, f"{m}_style")) for m in METRICS]
        lines.append("| " + " | ".join([model.replace("|", "\\|"), row.row.replace("|", "\\|"), *cells]) + " |")
    return "\n".join(lines) + "\n\n" + CAPTION
