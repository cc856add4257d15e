"""Table 1 on the paper's terms: gains over raw confidence and NWKR, euro, and base accuracy.

AUC-ETCU grows with the LLM's base accuracy (executing every call at low risk earns accuracy -
(1 - accuracy) / 9), so absolute values compare tasks, not estimators. Across setups an estimator is
compared by what it adds within its own setup: its gain over raw confidence and over NWKR (smECE:
reference - row, AUC-ETCU: row - reference; positive = better), with a 95% paired bootstrap interval
(the same resampled test calls score both rows), and by auc-euro (ACUTE: utility over the oracle's).

Also the published rows and each run's per-call test predictions as one long table
(``predictions.csv`` of a preset), so any cell or mark can be re-checked without re-running anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from mice_exp.metrics import auc_etcu, auc_euro, smece_rows
from mice_exp.report.plots import PredictionsFn
from mice_exp.report.tables import ABLATION, TABLE1
from mice_exp.tracking.schema import prediction_column

TABLE = "paper_terms"
REFERENCES = ("raw", "nwkr")
RESAMPLES = 1000
PREDICTION_TABLES = (TABLE1, ABLATION)  # the tables whose rows' predictions are published
#: MICE Table 1 (Subramani et al., ../shared/papers/mice_for_cats.md): (smECE, low-risk ETCU, AUC-ETCU).
PAPER_TABLE1 = {
    "Llama3-8B-Instruct": {"raw": (0.184, 0.351, 0.001), "nwkr": (0.039, 0.356, 0.118),
                           "mice_lr": (0.037, 0.356, 0.125), "mice_rf": (0.040, 0.356, 0.144)},
    "Llama3.1-8B-Instruct": {"raw": (0.229, 0.240, -0.127), "nwkr": (0.032, 0.239, 0.063),
                             "mice_lr": (0.050, 0.239, 0.071), "mice_rf": (0.032, 0.248, 0.104)},
    "Llama3.2-3B-Instruct": {"raw": (0.312, 0.231, -0.458), "nwkr": (0.027, 0.233, 0.057),
                             "mice_lr": (0.025, 0.232, 0.073), "mice_rf": (0.041, 0.237, 0.095)},
}


def implied_accuracy(etcu_low: float) -> float:
    """The accuracy at which executing every call earns ``etcu_low`` at low risk (fp = -1/9):
    E = a - (1 - a) / 9, so a = (9 E + 1) / 10. Raw confidence executes nearly every call at tau = 0.1."""
    return (9 * etcu_low + 1) / 10


def long_predictions(table: pd.DataFrame, predictions: PredictionsFn) -> pd.DataFrame:
    """Every row's test predictions, Table 1's and the feature ablation's (column ``table``): one line per
    (row, call) with its confidence and label, so any cell can be re-checked without re-running."""
    frames = []
    for row in table[table["table"].isin(PREDICTION_TABLES)].itertuples():
        frame = predictions(row.run_id)
        column = prediction_column(row.estimator)
        if frame is None or column not in frame:
            continue
        frames.append(pd.DataFrame({"table": row.table, "dataset": row.dataset, "llm": row.llm, "row": row.row,
                                    "estimator": row.estimator, "protocol": row.protocol, "features": row.features,
                                    "run_id": row.run_id, "id": frame["id"], "api": frame["api"],
                                    "confidence": frame[column], "label": frame["label"]}))
    columns = ["table", "dataset", "llm", "row", "estimator", "protocol", "features", "run_id", "id", "api",
               "confidence", "label"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _draws(long: pd.DataFrame, n_resamples: int, seed: int) -> tuple[list[str], np.ndarray]:
    ids = sorted(set(long["id"]))
    return ids, np.random.default_rng(seed).integers(0, len(ids), size=(n_resamples, len(ids)))


def _per_draw(p: np.ndarray, y: np.ndarray, draws: np.ndarray) -> dict[str, np.ndarray]:
    """smECE and AUC-ETCU on every resample (rows of ``draws``), and on the calls themselves (last)."""
    rows = np.vstack([draws, np.arange(len(y))])
    return {"smece": np.asarray(smece_rows(p[rows], y[rows]), dtype=float),
            "auc_etcu": np.array([auc_etcu(p[r], y[r]) for r in rows], dtype=float)}


GAIN: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "smece": lambda row, ref: ref - row, "auc_etcu": lambda row, ref: row - ref}


def paper_terms(long: pd.DataFrame, n_resamples: int = RESAMPLES, seed: int = 0,
                references: tuple[str, ...] = REFERENCES) -> pd.DataFrame:
    """Per row of ``long`` (:func:`long_predictions`; Table 1's, then the ablation's not already there): test
    accuracy, smECE, AUC-ETCU, auc-euro and the gains over each of ``references`` (estimators of the block's
    holdout rows; Table 1's raw confidence and NWKR unless told) with their 95% paired bootstrap intervals
    (NaN where a row's predictions do not cover its block's test calls)."""
    out = []
    long = long.sort_values("table", key=lambda t: t != TABLE1, kind="stable")
    long = long.drop_duplicates(["dataset", "llm", "estimator", "protocol", "run_id", "id"])  # one run: one row
    keys = ["row", "estimator", "protocol", "run_id"]
    progress = tqdm(total=long.groupby(["dataset", "llm", *keys]).ngroups, desc="report: gains on the paper's terms",
                    unit="row")
    for (dataset, llm), block in long.groupby(["dataset", "llm"], sort=True):
        ids, draws = _draws(block, n_resamples, seed)
        scored: dict[tuple, dict[str, np.ndarray]] = {}
        for key, rows in block.groupby(keys, sort=False):
            progress.update()
            rows = rows.set_index("id")
            if sorted(rows.index) != ids:
                continue
            p, y = rows.loc[ids, "confidence"].to_numpy(float), rows.loc[ids, "label"].to_numpy(int)
            scored[key] = _per_draw(p, y, draws) | {"auc_euro": np.array([auc_euro(p, y)]), "label": y}
        refs = {r: next((v for k, v in scored.items() if k[1] == r and k[2] == "holdout"), None) for r in references}
        for (row, estimator, protocol, run_id), values in scored.items():
            entry = {"table": TABLE, "dataset": dataset, "llm": llm, "row": row, "estimator": estimator,
                     "protocol": protocol, "run_id": run_id, "n_test": len(ids),
                     "accuracy": float(np.mean(values["label"])), "smece": values["smece"][-1],
                     "auc_etcu": values["auc_etcu"][-1], "auc_euro": values["auc_euro"][0]}
            for ref, ref_values in refs.items():
                paired = ref_values is not None and np.array_equal(ref_values["label"], values["label"])
                for metric, gain in GAIN.items():
                    name = f"gain_{metric}_vs_{ref}"
                    if not paired:  # no reference row, or one scored on other labels: nothing to pair
                        entry |= {name: np.nan, f"{name}_lo": np.nan, f"{name}_hi": np.nan}
                        continue
                    diff = gain(values[metric], ref_values[metric])
                    resampled = diff[:-1][np.isfinite(diff[:-1])]
                    entry[name] = diff[-1]
                    entry[f"{name}_lo"], entry[f"{name}_hi"] = np.percentile(resampled, [2.5, 97.5])
            out.append(entry)
    progress.close()
    return pd.DataFrame(out)


def paper_gains() -> pd.DataFrame:
    """The paper's own Table 1 gains of MICE LR / RF over raw confidence and NWKR, and its implied accuracy."""
    rows = []
    for llm, values in PAPER_TABLE1.items():
        for estimator in ("mice_lr", "mice_rf"):
            smece, _, auc = values[estimator]
            rows.append({"llm": llm, "estimator": estimator, "implied_accuracy": implied_accuracy(values["raw"][1]),
                         **{f"gain_smece_vs_{ref}": values[ref][0] - smece for ref in REFERENCES},
                         **{f"gain_auc_etcu_vs_{ref}": auc - values[ref][2] for ref in REFERENCES}})
    return pd.DataFrame(rows)


def _gain_cell(entry: Mapping[str, float], name: str) -> str:
    if not np.isfinite(entry[name]):
        return ""
    return f"{entry[name]:+.3f} [{entry[f'{name}_lo']:+.3f}, {entry[f'{name}_hi']:+.3f}]"


def paper_terms_markdown(frame: pd.DataFrame, table: pd.DataFrame, n_resamples: int = RESAMPLES) -> str:
    """The section: our rows' gains with intervals, each LLM's accuracy beside the paper's implied ones,
    and the paper's own gains."""
    if frame.empty:
        return ""
    parts = ["## On the paper's terms: gains over raw confidence and NWKR, euro, base accuracy",
             "AUC-ETCU grows with the LLM's base accuracy, so absolute values compare tasks, not estimators; "
             "compare estimators by their gains within a setup. Gain: smECE reference - row, AUC-ETCU row - "
             f"reference (positive = better), with a 95% paired bootstrap interval ({n_resamples} resamples of the "
             "test calls, both rows scored on each). auc-euro: ACUTE's utility over the oracle's, mean over "
             "the AUC-ETCU risk grid."]
    for (dataset, llm), block in frame.groupby(["dataset", "llm"], sort=True):
        raw = table[(table["dataset"] == dataset) & (table["llm"] == llm) & (table["estimator"] == "raw")]
        implied = implied_accuracy(float(raw["etcu_low"].iloc[0])) if len(raw) else float("nan")
        lines = [f"### {dataset}, {llm}: test accuracy {block['accuracy'].iloc[0]:.3f} on {block['n_test'].iloc[0]} "
                 f"calls (implied by raw confidence's low-risk ETCU, as for the paper below: {implied:.3f})", "",
                 "| Row | smECE | AUC-ETCU | auc-euro | smECE gain vs raw | AUC-ETCU gain vs raw | smECE gain vs NWKR "
                 "| AUC-ETCU gain vs NWKR |", "|---|---|---|---|---|---|---|---|"]
        for entry in block.to_dict("records"):
            cells = [_gain_cell(entry, f"gain_{m}_vs_{r}") for r in REFERENCES for m in ("smece", "auc_etcu")]
            lines.append(f"| {entry['row']} | {entry['smece']:.3f} | {entry['auc_etcu']:.3f} | {entry['auc_euro']:.3f} | "
                         + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    paper = paper_gains()
    lines = ["### The paper's own gains (MICE Table 1; no intervals published)",
             "Implied accuracy = (9 × raw confidence's low-risk ETCU + 1) / 10: executing every call at fp = -1/9 "
             "earns a - (1 - a) / 9, and raw confidence executes nearly every call at τ = 0.1.", "",
             "| LLM | implied accuracy | Row | smECE gain vs raw | AUC-ETCU gain vs raw | smECE gain vs NWKR "
             "| AUC-ETCU gain vs NWKR |", "|---|---|---|---|---|---|---|"]
    for entry in paper.to_dict("records"):
        lines.append(f"| {entry['llm']} | {entry['implied_accuracy']:.3f} | MICE {entry['estimator'][5:].upper()} | "
                     + " | ".join(f"{entry[f'gain_{m}_vs_{r}']:+.3f}" for r in REFERENCES for m in ("smece", "auc_etcu"))
                     + " |")
    parts.append("\n".join(lines))
    return "\n\n".join(parts)
