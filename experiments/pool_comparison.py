"""Old (``prompt.demo_pool=all``) and new (``train``) headline cells of a preset side by side, and the
preset's gains on the paper's terms.

    python experiments/pool_comparison.py experiments/table1/pool-all/results.csv experiments/table1/results.csv
    python experiments/pool_comparison.py --gains experiments/risk_sweep/results.csv

Reads report ``results.csv`` files. Two files: per LLM and Table-1 row present in both, smECE and AUC-ETCU
under each pool with their 95% bootstrap intervals. ``--gains``: per LLM and row of the report's "On the
paper's terms" section, AUC-ETCU, auc-euro and the AUC-ETCU gain over raw confidence and over NWKR with
their 95% paired bootstrap intervals (the table each preset README quotes).
"""

from __future__ import annotations

import sys

import pandas as pd

CELLS = ("smece", "auc_etcu")


def _cell(row: pd.Series, metric: str) -> str:
    interval = f" [{row[f'{metric}_lo']:.3f}, {row[f'{metric}_hi']:.3f}]" if f"{metric}_lo" in row and pd.notna(
        row[f"{metric}_lo"]) else ""
    return f"{row[metric]:.3f}{interval}"


def side_by_side(old_csv: str, new_csv: str) -> str:
    old, new = (pd.read_csv(p) for p in (old_csv, new_csv))
    old, new = (f[f["table"] == "table1"].set_index(["llm", "row"]) for f in (old, new))
    lines = ["| LLM | row | smECE, pool all | smECE, pool train | AUC-ETCU, pool all | AUC-ETCU, pool train |",
             "|---|---|---|---|---|---|"]
    for key in [k for k in new.index if k in old.index]:
        a, b = old.loc[key], new.loc[key]
        lines.append(f"| {key[0]} | {key[1]} | {_cell(a, 'smece')} | {_cell(b, 'smece')} | "
                     f"{_cell(a, 'auc_etcu')} | {_cell(b, 'auc_etcu')} |")
    return "\n".join(lines)


def _gain(row: pd.Series, reference: str) -> str:
    name = f"gain_auc_etcu_vs_{reference}"
    return f"{row[name]:+.3f} [{row[f'{name}_lo']:+.3f}, {row[f'{name}_hi']:+.3f}]"


def gains(csv: str) -> str:
    terms = pd.read_csv(csv)
    terms = terms[terms["table"] == "paper_terms"]
    lines = ["| LLM | row | AUC-ETCU | auc-euro | AUC-ETCU gain vs raw | AUC-ETCU gain vs NWKR |",
             "|---|---|---|---|---|---|"]
    for (llm, row), cell in terms.groupby(["llm", "row"], sort=False):
        r = cell.iloc[0]
        vs_raw = "–" if row == "Raw Confidence" else _gain(r, "raw")
        vs_nwkr = "–" if row == "NWKR" else _gain(r, "nwkr")
        lines.append(f"| {llm} | {row} | {r['auc_etcu']:.3f} | {r['auc_euro']:.3f} | {vs_raw} | {vs_nwkr} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(gains(sys.argv[2]) if sys.argv[1] == "--gains" else side_by_side(*sys.argv[1:3]))
