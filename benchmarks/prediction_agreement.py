"""Two records files of the same calls (made on two backends or machines): where their inputs differ, one estimator's
test predictions under one protocol on each, and which calls and which Table 1 cells those differences move.

What ``benchmarks/reproduce.py`` cannot say from its tables alone: when a cell differs in the third decimal, whether
the features differ (and which column), and whether one call crossing a risk's threshold explains the cell. The second
file may instead be a published ``predictions.csv`` (``experiments/table1/``): the predictions the row ``--row`` of
that run saved, against the first file's made here (a machine against the one that published the table).

    .venv/bin/python benchmarks/prediction_agreement.py experiments/records/ste-smollm2_135m.jsonl.gz OTHER.jsonl.gz \\
        [--llm smollm2_135m] [--features bertscore] [--estimator mice_rf] [--protocol loao] [--json FILE] [overrides...]
    .venv/bin/python benchmarks/prediction_agreement.py experiments/records/ste-smollm2_135m.jsonl.gz \\
        experiments/table1/predictions.csv --row "MICE RF Zeroshot"
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from mice_exp.compose import as_plain, compose_config
from mice_exp.metrics.evaluate import evaluate
from mice_exp.metrics.utility import PAPER_RISKS
from mice_exp.pipeline import Pipeline

CELLS = ("smece", "etcu_low", "etcu_medium", "etcu_high", "auc_etcu")  # Table 1's columns


def predictions(records: Path, args: argparse.Namespace) -> tuple[Any, np.ndarray, bool]:
    """The records file's FeatureSet, the estimator's test predictions under the protocol (as a run makes them) and
    whether it reads the feature view (not only the raw confidence)."""
    cfg = as_plain(compose_config([f"llm={args.llm}", f"llm.records={records}", f"features={args.features}",
                                   f"estimator={args.estimator}", f"protocol={args.protocol}", "tracking.enabled=false",
                                   *args.overrides]))
    pipeline = Pipeline.from_config(cfg)
    fs = pipeline.features(pipeline.stage_output())
    main = pipeline.study.main
    reads_view = main.estimator.input_columns(fs.columns, main.source) != [main.source]
    return fs, pipeline.protocol.predict(main.estimator, fs, main.source)[0], reads_view


def published(csv_path: Path, args: argparse.Namespace, reads_view: bool) -> dict[str, float]:
    """The test predictions a published run saved for the row ``args.row`` (e.g. "MICE RF Zeroshot") of ``args.llm``,
    by call id; refused unless that row's estimator, protocol and (for an estimator that reads them) features are the
    ones asked for here."""
    with csv_path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["llm"] == args.llm and r["row"] == args.row]
    if not rows:
        raise SystemExit(f"prediction_agreement: {csv_path} has no predictions of row {args.row!r} for llm={args.llm}; "
                         "expected a row name as the table prints it")
    made = {(r["estimator"], r["protocol"], r["features"] if reads_view else args.features) for r in rows}
    if made != {(args.estimator, args.protocol, args.features)}:
        raise SystemExit(f"prediction_agreement: row {args.row!r} was made by (estimator, protocol, features) {made}; "
                         f"expected --estimator {args.estimator} --protocol {args.protocol} --features {args.features}")
    return {r["id"]: float(r["confidence"]) for r in rows}


def compare(first: Path, second: Path, args: argparse.Namespace) -> dict[str, Any]:
    fs_a, p_a, reads_view = predictions(first, args)
    test = fs_a.rows("test")
    y, ids = fs_a.labels[test], np.array(fs_a.ids)[test]
    gaps: dict[str, float] | None = None  # unknown against a predictions file
    if second.suffix == ".csv":
        saved = published(second, args, reads_view)
        if sorted(saved) != sorted(ids):
            raise SystemExit("prediction_agreement: the published predictions are of other test calls")
        p_b = np.array([saved[i] for i in ids])
    else:
        fs_b, p_b, _ = predictions(second, args)
        if fs_a.ids != fs_b.ids or list(fs_a.columns) != list(fs_b.columns):
            raise SystemExit("prediction_agreement: the two files' calls or feature columns differ; expected the same "
                             "calls")
        if not np.array_equal(fs_a.labels, fs_b.labels) or not np.array_equal(test, fs_b.rows("test")):
            raise SystemExit("prediction_agreement: the two files' labels or splits differ; expected the same calls")
        apart = np.isnan(fs_a.X) != np.isnan(fs_b.X)  # a value in one file, NaN in the other: an infinite gap
        gap = np.where(apart, np.inf, np.nan_to_num(np.abs(fs_a.X - fs_b.X))).max(axis=0)
        gaps = {c: float(g) for c, g in zip(fs_a.columns, gap) if g > 0}
    flips = {name: [(str(i), int(label), float(a), float(b))
                    for i, label, a, b in zip(ids, y, p_a, p_b) if (a > risk.tau) != (b > risk.tau)]
             for name, risk in PAPER_RISKS.items()}
    m_a, m_b = evaluate(p_a, y, {}), evaluate(p_b, y, {})
    return {
        "test_calls": int(test.sum()),
        "feature_columns_that_differ": gaps,
        "predictions_that_differ": int((p_a != p_b).sum()),
        "largest_prediction_difference": float(np.abs(p_a - p_b).max()),
        "decisions_that_flip": {name: {"tau": PAPER_RISKS[name].tau, "calls": calls} for name, calls in flips.items()},
        "cells": {c: [round(m_a[c], 6), round(m_b[c], 6)] for c in CELLS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--llm", default="smollm2_135m")
    parser.add_argument("--features", default="bertscore")
    parser.add_argument("--estimator", default="mice_rf")
    parser.add_argument("--protocol", default="loao")
    parser.add_argument("--row", default="MICE RF Zeroshot", help="the published row, when the second file is a CSV")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*", help="more config overrides, as on the command line")
    args = parser.parse_args()
    found = compare(args.first, args.second, args)
    print(f"{args.estimator} under {args.protocol} on {found['test_calls']} test calls")
    gaps = found["feature_columns_that_differ"]
    print("feature columns that differ (largest absolute difference): "
          + ("unknown (published predictions)" if gaps is None else ", ".join(f"{c} {g:.2g}" for c, g in gaps.items())
             or "none"))
    print(f"predictions that differ: {found['predictions_that_differ']} (largest {found['largest_prediction_difference']:.3g})")
    for name, flip in found["decisions_that_flip"].items():
        calls = "; ".join(f"{i} (label {label}: {a:.4f} against {b:.4f})" for i, label, a, b in flip["calls"][:5])
        print(f"  {name} risk (tau {flip['tau']:g}): {len(flip['calls'])} decisions flip" + (f": {calls}" if calls else ""))
    for cell, (a, b) in found["cells"].items():
        print(f"  {cell:12s} {a:.3f}  {b:.3f}" + ("" if f"{a:.3f}" == f"{b:.3f}" else "   <- differs at the third decimal"))
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
