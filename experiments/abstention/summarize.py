"""Abstention against a truth: how often an LLM calls a function when none fits, and whether its confidence
says so, from a records file of BFCL's relevance categories (mixed with a call category).

    python experiments/abstention/summarize.py experiments/records/bfcl-abstention-<llm>.jsonl.gz ... \
        [--gate GATE_FOLDER ...]

Per category: calls made (a parsed ``Action`` with JSON arguments, BFCL's "contains a function call"),
accuracy by BFCL's labels, and the replies without a call in three kinds that BFCL counts alike (as no
call: right where no function fits) but that are not alike: an answer in words (a decline, or prose: no function named), a call
that did not parse (a function named, its arguments no JSON object) and a call cut at the token limit (a
function named, the reply stopped by ``llm.max_new_tokens`` before its arguments closed); then, over the calls the model made, the AUROC with which raw confidence tells
a call on a query that needs one (live_simple, live_relevance) from a call on a query no function fits
(irrelevance, live_irrelevance): 0.5 is no signal. With ``--gate`` (a gate folder saved by a holdout run on
the same LLM, e.g. MICE RF on STE: `mice-exp` writes it under the run's artifacts), the gate's calibrated
probability is scored the same way, and its decisions (execute a call when its probability passes the
gate's tau) against BFCL's labels. Without a gate it reads the records only; a gate computes its feature
view (BERTScore loads torch).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from mice_exp.data.bfcl import RELEVANCE_CATEGORIES
from mice_exp.data.labels import made_call
from mice_exp.llm.records import made_with, read_records_file, read_records_header
from mice_exp.metrics import auroc
from mice_exp.metrics.bootstrap import bootstrap_intervals

NO_CALL_FITS = tuple(category for category, expected in RELEVANCE_CATEGORIES.items() if not expected)
NO_CALL_KINDS = ("in words, no function named", "a call that did not parse", "a call cut at the token limit")


def no_call_kind(record: dict[str, Any], max_new_tokens: int) -> str | None:
    """Which of :data:`NO_CALL_KINDS` a reply without a call is (None for a call): a reply that names no
    function answered in words (a decline, or prose); one that names a function and stops, or is stopped
    at the token limit, before its arguments parse began a call."""
    if made_call(record["pred_api"], record["pred_args"]):
        return None
    if record["pred_api"] is None:
        return NO_CALL_KINDS[0]
    return NO_CALL_KINDS[2] if len(record["token_ids"]) >= max_new_tokens else NO_CALL_KINDS[1]


def summary(path: Path, gates: dict[str, Any]) -> str:
    stage = read_records_file(path, "bfcl")
    records = stage.records
    llm = stage.info.get("llm", path.name)
    limit = int(made_with(read_records_header(path))["max_new_tokens"])
    kinds = [no_call_kind(r, limit) for r in records]
    lines = [f"### {llm}: {len(records)} calls ({path.name})", "",
             "| category | calls | queries where it made a call | accuracy (BFCL's label) | no call: "
             + " | ".join(NO_CALL_KINDS) + " |", "|---|---:|---:|---:|" + "---:|" * len(NO_CALL_KINDS)]
    for category in sorted({r["api"] for r in records}):
        rows = [n for n, r in enumerate(records) if r["api"] == category]
        called = np.mean([kinds[n] is None for n in rows])
        counts = " | ".join(str(sum(kinds[n] == kind for n in rows)) for kind in NO_CALL_KINDS)
        lines.append(f"| {category} | {len(rows)} | {called:.2f} | {np.mean([records[n]['label'] for n in rows]):.2f} "
                     f"| {counts} |")
    made = np.array([kind is None for kind in kinds])
    needed = np.array([r["api"] not in NO_CALL_FITS for r in records], dtype=int)
    no_fit = [kind for kind, need in zip(kinds, needed) if not need]
    declined = sum(kind is not None for kind in no_fit)
    lines += ["", f"Where no function fits it made no call on {declined} of {len(no_fit)} queries: it answered in words "
              f"(naming no function) on {no_fit.count(NO_CALL_KINDS[0])}, began a call that did not parse on "
              f"{no_fit.count(NO_CALL_KINDS[1])} and one cut at the {limit}-token limit on "
              f"{no_fit.count(NO_CALL_KINDS[2])} (BFCL counts all {declined} as right)."]
    scores = {"raw confidence": np.array([r["raw_confidence"] for r in records])}
    gate = gates.get(llm)
    if gate is not None:
        gate_p = gate.probabilities(gate.features(stage))
        scores[f"the gate ({gate.describe()})"] = gate_p
    wrong_kind = int(made.sum() - needed[made].sum())
    if not 0 < needed[made].sum() < made.sum():
        lines += ["", f"It made {int(made.sum())} calls, {wrong_kind} of them where no function fits: no AUROC to "
                  "compute (it needs calls of both kinds)."]
    else:
        lines += ["", f"Of the {int(made.sum())} calls it made, {wrong_kind} answer a query no function fits. "
                  "How well each confidence tells the others from them (AUROC, 0.5: no signal), and its mean on each:",
                  "", "| confidence | AUROC [95% bootstrap] | mean where a call was needed | mean where none fits |",
                  "|---|---|---:|---:|"]
        for name, p in scores.items():
            q, y = p[made], needed[made]
            low, high = bootstrap_intervals(q, y, {"auroc": auroc}, n_resamples=1000)["auroc"]
            lines.append(f"| {name} | {auroc(q, y):.3f} [{low:.3f}, {high:.3f}] | {q[y == 1].mean():.3f} | "
                         f"{q[y == 0].mean():.3f} |")
    if gate is not None:
        lines += ["", decisions(records, made, needed, gate_p, gate.tau)]
    return "\n".join(lines)


def decisions(records: list[dict[str, Any]], made: np.ndarray, needed: np.ndarray, p: np.ndarray, tau: float) -> str:
    """The gate's decisions against BFCL's labels: an executed call is right only where a call is needed and
    the call is correct; where no function fits, executing anything is wrong."""
    execute = made & (p > tau)
    correct = np.array([r["label"] for r in records], dtype=bool)
    rows = [("no function fits", needed == 0), ("a call is needed", needed == 1)]
    lines = [f"The gate at its tau = {tau:g}:", "",
             "| queries | n | LLM made a call | gate executes | executed and right | executed and wrong |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, where in rows:
        right = execute & where & correct & (needed == 1)
        lines.append(f"| {name} | {int(where.sum())} | {int((made & where).sum())} | {int((execute & where).sum())} "
                     f"| {int(right.sum())} | {int((execute & where).sum() - right.sum())} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+", type=Path, help="records files of dataset=bfcl_relevance")
    parser.add_argument("--gate", nargs="*", default=[], type=Path, help="gate folders, matched to records by LLM")
    args = parser.parse_args()
    gates = {}
    if args.gate:
        from mice_exp.gate import Gate

        gates = {gate.spec["llm"]["name"]: gate for gate in map(Gate.load, args.gate)}
    print("\n\n".join(summary(path, gates) for path in args.records))


if __name__ == "__main__":
    main()
