"""Abstention against a truth: how often an LLM calls a function when none fits, and whether its raw
confidence says so, from a records file of BFCL's relevance categories (mixed with a call category).

    python experiments/abstention/summarize.py experiments/records/bfcl-abstention-<llm>.jsonl.gz ...

Per category: calls made (a parsed ``Action`` with JSON arguments, BFCL's "contains a function call"),
accuracy by BFCL's labels; then, over the calls the model made, the AUROC with which raw confidence tells
a call on a query that needs one (live_simple, live_relevance) from a call on a query no function fits
(irrelevance, live_irrelevance): 0.5 is no signal. Torch-free: reads the records only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from mice_exp.llm.records import read_records_file
from mice_exp.metrics import auroc

NO_CALL_FITS = ("irrelevance", "live_irrelevance")


def summary(path: Path) -> str:
    stage = read_records_file(path, "bfcl")
    records = stage.records
    lines = [f"### {stage.info.get('llm', path.name)}: {len(records)} calls ({path.name})", "",
             "| category | calls | queries where it made a call | accuracy (BFCL's label) |", "|---|---|---|---|"]
    for category in sorted({r["api"] for r in records}):
        rows = [r for r in records if r["api"] == category]
        called = np.mean([r["pred_api"] is not None and r["pred_args"] is not None for r in rows])
        lines.append(f"| {category} | {len(rows)} | {called:.2f} | {np.mean([r['label'] for r in rows]):.2f} |")
    made = [r for r in records if r["pred_api"] is not None and r["pred_args"] is not None]
    needed = np.array([r["api"] not in NO_CALL_FITS for r in made], dtype=int)
    confidence = np.array([r["raw_confidence"] for r in made])
    wrong_kind = len(made) - int(needed.sum())
    if not 0 < needed.sum() < len(made):
        lines += ["", f"It made {len(made)} calls, {wrong_kind} of them where no function fits: no AUROC to compute "
                  "(it needs calls of both kinds)."]
        return "\n".join(lines)
    lines += ["", f"Of the {len(made)} calls it made, {wrong_kind} answer a query no function fits; raw confidence "
              f"tells the others from them with AUROC {auroc(confidence, needed):.3f} (0.5: no signal); mean raw "
              f"confidence {confidence[needed == 1].mean():.3f} where a call was needed, "
              f"{confidence[needed == 0].mean():.3f} where none fits."]
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(summary(Path(p)) for p in sys.argv[1:]))
