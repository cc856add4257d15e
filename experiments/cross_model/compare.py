"""Judge != actor: each (actor, judge) pair's rows against the actor's own raw confidence, NWKR and MICE RF.

    python experiments/cross_model/compare.py [--out experiments/cross_model] [--reuse-self-gate]

Reads the actor's own Table 1 predictions (``experiments/table1/predictions.csv``: raw confidence, NWKR and
MICE RF of the actor on its 200 test calls), the cross runs' predictions (``<out>/predictions.csv``, the report of the
``cross_model`` sweep over ``experiments/records/ste-<actor>-judged-by-<judge>.jsonl.gz``) and applies each
judge's own gate unchanged (``experiments/abstention/gate-<judge>``: its MICE RF fitted on its own 400 training
calls, the one Table 1 reports) to the judged records' test calls. Per actor, every row (the judge's raw
confidence of the actor's call, HRE / NWKR on it, MICE LR / RF fitted on the pair's training calls, the judge's
self-gate) gets smECE and AUC-ETCU with its gain over the actor's own raw confidence, NWKR and MICE RF (the
cost of judging with another model's internals instead of the actor's own): 95% paired
bootstrap intervals (1000 resamples of the test calls, :func:`mice_exp.report.paper_terms.paper_terms`) and
two-sided paired permutation p-values (:func:`mice_exp.metrics.permutation_test`: drawn until p is on one side
of 0.05 with 99.9% confidence, so a p far from 0.05 is an estimate from a few hundred draws).
Writes ``<out>/gains.csv`` and ``<out>/self_gate_predictions.csv`` (``--reuse-self-gate`` reads it back instead:
every number from the published predictions); prints the markdown table the README quotes.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from mice_exp.metrics import ALPHA, auc_etcu, auc_etcu_rows, permutation_test, smece, smece_rows
from mice_exp.metrics.permutation import Metric, RowsMetric
from mice_exp.paths import PACKAGE_ROOT
from mice_exp.report.paper_terms import paper_terms

ROOT = PACKAGE_ROOT
PAIRS = (("smollm2_135m", "gemma3_270m"), ("gemma3_270m", "smollm2_135m"))  # (actor, judge)
#: the actor's own rows, the references: its raw confidence and NWKR (what calibrating another model's calls
#: must beat) and its MICE RF (self-judgement: what judging with another model's internals costs)
OWN = {"raw": "actor's raw confidence", "nwkr": "actor's NWKR", "mice_rf": "actor's MICE RF"}
#: the printed table's gain columns: (metric, reference)
COLUMNS = (("auc_etcu", "raw"), ("auc_etcu", "nwkr"), ("smece", "nwkr"), ("auc_etcu", "mice_rf"), ("smece", "mice_rf"))


def self_gate(actor: str, judge: str) -> pd.DataFrame:
    """The judge's own gate (fitted on the judge's calls) applied unchanged to the judged records' test calls."""
    from mice_exp.gate import Gate
    from mice_exp.llm.records import StageOutput, read_records_file

    judged = read_records_file(ROOT / "experiments" / "records" / f"ste-{actor}-judged-by-{judge}.jsonl.gz", "ste")
    test = [r for r in judged.records if r["split"] == "test"]
    gate = Gate.load(ROOT / "experiments" / "abstention" / f"gate-{judge}")
    p = gate.probabilities(gate.features(StageOutput(records=test, info=judged.info, key=f"{judged.key}-test")))
    return pd.DataFrame({"id": [r["id"] for r in test], "api": [r["api"] for r in test], "confidence": p,
                         "label": [r["label"] for r in test]})


def published_gate(published: pd.DataFrame, actor: str, judge: str) -> pd.DataFrame:
    """One pair's self-gate predictions from ``self_gate_predictions.csv``, as :func:`self_gate` gives them."""
    pair = published[(published["actor"] == actor) & (published["judge"] == judge)]
    return pair.drop(columns=["actor", "judge"]).reset_index(drop=True)


def rows_of(actor: str, judge: str, own: pd.DataFrame, cross: pd.DataFrame, gate: pd.DataFrame) -> pd.DataFrame:
    """One block for ``actor``: its own raw / NWKR (the references) and the judge's rows, holdout only."""
    frames = [own[(own["llm"] == actor) & own["estimator"].isin(list(OWN)) & (own["protocol"] == "holdout")]
              .assign(row=lambda f: f["estimator"].map(OWN))]
    mine = cross[(cross["llm"] == judge) & (cross["protocol"] == "holdout")]
    frames.append(mine.assign(row=lambda f: "judge: " + f["row"], estimator=lambda f: "judge_" + f["estimator"]))
    frames.append(gate.assign(row="judge's self-gate (MICE RF), unchanged", estimator="self_gate_mice_rf",
                              protocol="holdout", run_id=f"gate-{judge}"))
    block = pd.concat(frames, ignore_index=True).assign(llm=actor, dataset="ste", table="table1")
    return block.drop_duplicates(["estimator", "id"])


#: One test: (row's estimator, p-value column, metric, its rows form, the row's and the reference's p, labels).
Test = tuple[str, str, Metric, RowsMetric | None, np.ndarray, np.ndarray, np.ndarray]


def tests(block: pd.DataFrame) -> Iterator[Test]:
    """Every test :func:`p_values` runs: each row's smECE and AUC-ETCU against the actor's raw confidence, NWKR and
    MICE RF."""
    wide = block.pivot(index="id", columns="estimator", values="confidence")
    y = block.drop_duplicates("id").set_index("id").loc[wide.index, "label"].to_numpy(int)
    for estimator in wide.columns:
        for ref in OWN:
            for name, metric, rows in (("smece", smece, smece_rows), ("auc_etcu", auc_etcu, auc_etcu_rows)):
                yield (estimator, f"p_{name}_vs_{ref}", metric, rows, wide[estimator].to_numpy(float),
                       wide[ref].to_numpy(float), y)


def p_values(block: pd.DataFrame) -> pd.DataFrame:
    """Two-sided paired permutation p-values of :func:`tests`, each decided on its side of alpha."""
    out: dict[str, dict] = {}
    for estimator, column, metric, rows, p_row, p_ref, y in tests(block):
        test = permutation_test(metric, p_row, p_ref, y, seed=0, alpha=ALPHA, rows_metric=rows)
        out.setdefault(estimator, {"estimator": estimator})[column] = test.p_value
    return pd.DataFrame(out.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "experiments" / "cross_model"))
    parser.add_argument("--reuse-self-gate", action="store_true",
                        help="read <out>/self_gate_predictions.csv instead of applying the gates (no encoder runs)")
    args = parser.parse_args()
    out = Path(args.out)
    own = pd.read_csv(ROOT / "experiments" / "table1" / "predictions.csv")
    cross = pd.read_csv(out / "predictions.csv")
    published = pd.read_csv(out / "self_gate_predictions.csv") if args.reuse_self_gate else None
    gates, blocks = [], []
    for actor, judge in PAIRS:
        gate = self_gate(actor, judge) if published is None else published_gate(published, actor, judge)
        gates.append(gate.assign(actor=actor, judge=judge))
        blocks.append(rows_of(actor, judge, own, cross, gate))
    pd.concat(gates).to_csv(out / "self_gate_predictions.csv", index=False)
    terms = pd.concat([paper_terms(block, references=tuple(OWN)).merge(p_values(block), on="estimator").assign(
        judge=judge) for block, (_, judge) in zip(blocks, PAIRS)])
    terms.to_csv(out / "gains.csv", index=False)
    names = {"auc_etcu": "AUC-ETCU", "smece": "smECE"}
    print("| actor | judge | row | smECE | AUC-ETCU | "
          + " | ".join(f"{names[m]} gain vs {OWN[r].replace('confidence', '').strip()} (p)" for m, r in COLUMNS) + " |")
    print("|---" * (5 + len(COLUMNS)) + "|")
    for t in terms.itertuples():
        cells = [f"{getattr(t, f'gain_{m}_vs_{r}'):+.3f} [{getattr(t, f'gain_{m}_vs_{r}_lo'):+.3f}, "
                 f"{getattr(t, f'gain_{m}_vs_{r}_hi'):+.3f}] (p {getattr(t, f'p_{m}_vs_{r}'):.3f})"
                 for m, r in COLUMNS]
        judge = "(own)" if t.estimator in OWN else t.judge
        print(f"| {t.llm} | {judge} | {t.row} | {t.smece:.3f} | {t.auc_etcu:.3f} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
