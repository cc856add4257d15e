"""The report's figures: ETCU curves per LLM (MICE Figure 4) and holdout vs zero-shot AUC.

Curves are recomputed from each run's ``predictions.csv`` (read through MLflow by the caller)
rather than taken from the runs' own figures, so each LLM gets one figure with every row of
its Table 1 block and the trivial policies. Figures follow :mod:`mice_exp.report.figures`:
built without pyplot, nothing global touched.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from mice_exp.metrics import TAU_GRID, TRIVIAL_POLICIES, etcu_curve
from mice_exp.report import figures
from mice_exp.tracking.schema import prediction_column

logger = logging.getLogger(__name__)

HOLDOUT_COLOR = "#1f77b4"
ZEROSHOT_COLOR = "#ff7f0e"

PredictionsFn = Callable[[str], "pd.DataFrame | None"]


def slug(text: str) -> str:
    """A file-name-safe version of a name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("_") or "x"


def etcu_file(dataset: str, llm: str) -> str:
    return f"etcu_{slug(dataset)}_{slug(llm)}.png"


LOAO_FILE = "loao_auc.png"


def prediction_pair(frame: pd.DataFrame | None, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """A row's test predictions and labels from its run's predictions.csv (None when absent)."""
    column = prediction_column(key)
    if frame is None or column not in frame or "label" not in frame:
        return None
    kept = frame[[column, "label"]].dropna()
    return kept[column].to_numpy(dtype=float), kept["label"].astype(int).to_numpy()


def etcu_figures(table: pd.DataFrame, predictions: PredictionsFn, taus: np.ndarray = TAU_GRID) -> dict[str, Figure]:
    """One ETCU figure per (dataset, LLM) block of Table 1: a curve per row, trivial policies dashed.

    ``predictions(run_id)`` returns a run's ``predictions.csv`` (None when missing); a row whose
    run has no ``p_<estimator>`` column is left out with a warning.
    """
    out: dict[str, Figure] = {}
    for (dataset, llm), block in table.groupby(["dataset", "llm"], sort=False):
        curves: dict[str, np.ndarray] = {}
        labels = None
        for row in block.itertuples(index=False):
            pair = prediction_pair(predictions(row.run_id), row.estimator)
            if pair is None:
                logger.warning("%s / %s: no predictions for %s (run %s); curve left out",
                               dataset, llm, row.row, row.run_id)
                continue
            p, y = pair
            curves[row.row] = etcu_curve(p, y, taus)
            if labels is None or row.source == "baseline":
                labels = y
        if not curves:
            continue
        policies = {name: etcu_curve(policy(labels), labels, taus) for name, policy in TRIVIAL_POLICIES.items()}
        title = f"{block['llm_display'].iloc[0]} on {dataset}"
        out[etcu_file(dataset, llm)] = figures.etcu_curves(curves, taus, policies, title=title)
    return out


def loao_pairs(table: pd.DataFrame) -> dict[str, list[tuple[str, float, float]]]:
    """Per block title, (estimator name, holdout AUC, zero-shot AUC) of each estimator with a
    leave-one-API-out row (NaN where the holdout row is missing)."""
    panels: dict[str, list[tuple[str, float, float]]] = {}
    for (dataset, _), block in table.groupby(["dataset", "llm"], sort=False):
        zeroshot = block[block["protocol"] == "loao"]
        if zeroshot.empty:
            continue
        holdout = block[block["protocol"] == "holdout"].set_index("estimator")
        pairs = []
        for row in zeroshot.itertuples(index=False):
            name = row.row.removesuffix(" Zeroshot")
            held = float(holdout.loc[row.estimator, "auc_etcu"]) if row.estimator in holdout.index else np.nan
            pairs.append((name, held, float(row.auc_etcu)))
        panels[f"{block['llm_display'].iloc[0]} ({dataset})"] = pairs
    return panels


def loao_comparison(panels: Mapping[str, Sequence[tuple[str, float, float]]], *, metric: str = "AUC-ETCU") -> Figure:
    """Grouped bars, holdout next to zero-shot (leave-one-API-out), per estimator; one panel per LLM.

    Bars carry gids ``bar:<panel>:<estimator>:holdout|zeroshot``; a NaN value draws no bar.
    """
    if not panels:
        raise ValueError("loao_comparison needs at least one panel")
    n = len(panels)
    width_per = max(3.0, 1.1 * max(len(v) for v in panels.values()) + 1.0)
    fig = Figure(figsize=(min(width_per * n, 18.0), 4.2), layout="constrained")
    axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
    for ax, (title, pairs) in zip(axes, panels.items()):
        x = np.arange(len(pairs))
        for offset, index, kind, color in ((-0.2, 1, "holdout", HOLDOUT_COLOR), (0.2, 2, "zeroshot", ZEROSHOT_COLOR)):
            for i, pair in enumerate(pairs):
                value = float(pair[index])
                if np.isfinite(value):
                    bars = ax.bar(x[i] + offset, value, width=0.38, color=color)
                    bars.patches[0].set_gid(f"bar:{title}:{pair[0]}:{kind}")
        ax.axhline(0.0, color="black", linewidth=0.8)
        crowded = len(pairs) > 3
        ax.set_xticks(x, [p[0] for p in pairs], rotation=30 if crowded else 0,
                      ha="right" if crowded else "center", fontsize="small")
        ax.set_xlim(-0.6, len(pairs) - 0.4)
        ax.set_title(title, fontsize="medium")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel(f"{metric} (higher is better)")
    legend = [Patch(color=HOLDOUT_COLOR, label="holdout"),
              Patch(color=ZEROSHOT_COLOR, label="zeroshot (leave one API out)")]
    fig.legend(handles=legend, loc="outside lower center", ncols=2, fontsize="small", frameon=False)
    return fig
