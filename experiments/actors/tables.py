"""Other agents' calls judged by a small LLM: per-actor, leave-one-actor-out and pooled tables, and the pooled gates.

    python experiments/actors/tables.py [--judges smollm2_135m,gemma3_270m] [--out experiments/actors]
        [--records experiments/records/actors] [overrides ...]

Reads the judged records ``experiments/records/actors/ste-<actor>-judged-by-<judge>.jsonl.gz`` (``mice-exp records
llm=<judge> actor=all``: each actor's parsed calls rendered canonically and teacher-forced through the judge; a
reply that does not parse is not judged, as a host never hands a guard one). Every actor answered the same 750 STE
queries, split as ``dataset=ste`` splits them (400 train / 150 validation / 200 test for every actor: no test
query trains any row). Per judge, the BERTScore view of each actor's records (cached in ``.cache/features``), then:

* **per actor** (holdout): raw confidence (the judge's probability of the actor's call), the judge's P(True) of the
  call (the LLM-as-judge baseline, where the records hold it: ``mice-exp records ... sources.use=[p_true]``), HRE,
  NWKR, MICE LR and MICE RF fitted on that actor's training calls: the ceiling, what an agent's own labels buy;
* **leave-one-actor-out**: MICE LR / RF fitted on every other actor's training calls (their own judge features
  and labels), tested on the held-out actor's test calls: the deployment case, no label of the new agent used;
* **pooled**: MICE LR / RF fitted on all actors' training calls (the held-out actor's included), tested on each
  actor's test calls; its MICE RF saved as ``<out>/gate-<judge>/`` (``Gate.load`` reads it).

Every row: smECE, Brier, AUROC, ETCU at tau = 0.1 / 0.5 / 0.9 and AUC-ETCU on the actor's test calls, ``*`` / ``†``
where a row beats the actor's HRE / NWKR (paired permutation test, p < 0.05 decided as a run decides it, seed 0),
and the gains over raw confidence with 95% paired bootstrap intervals (:func:`mice_exp.report.paper_terms.paper_terms`).
Writes ``<out>/predictions.csv`` (every row's test predictions), ``<out>/rows.csv`` (every row's metrics),
``<out>/gains.csv``, ``<out>/summary.csv``, and ``<out>/tables.md`` (every row, the summary, the own calls and the
localisation as markdown; the README quotes it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.base import clone

from mice_exp.compose import compose_config
from mice_exp.estimation import Candidate
from mice_exp.gate import save_gate
from mice_exp.llm.judge import judged_path
from mice_exp.llm.records import read_records_file, read_records_header
from mice_exp.metrics import PAPER_RISKS, etcu
from mice_exp.paths import PACKAGE_ROOT
from mice_exp.pipeline import Pipeline
from mice_exp.report.paper_terms import paper_terms

ROOT = PACKAGE_ROOT
RECORDS = ROOT / "experiments" / "records" / "actors"
JUDGES = ("smollm2_135m", "gemma3_270m")
MICE = ("mice_lr", "mice_rf")
METRICS = ("smece", "brier", "auroc", "etcu_low", "etcu_medium", "etcu_high", "auc_etcu")
NAMES = {"raw": "Raw confidence", "p_true": "P(True)", "hre": "HRE", "nwkr": "NWKR", "mice_lr": "MICE LR",
         "mice_rf": "MICE RF"}


def pipeline_for(judge: str, actor: str, records: Path, overrides: list[str]) -> Pipeline:
    """The judge's Table-1 pipeline on one actor's judged records: MICE RF with raw / HRE / NWKR / MICE LR beside,
    and the judge's P(True) of the call where the records hold it (``sources.use=[p_true]`` when judging)."""
    path = judged_path(records, "ste", actor, judge)
    p_true = ["p_true"] if "p_true" in read_records_header(path).get("sources", []) else []
    return Pipeline.from_config(compose_config([
        f"llm={judge}", f"actor={actor}", f"llm.records={path}", "estimator=mice_rf",
        f"compare_with=[{','.join(['raw', *p_true, 'hre', 'nwkr', 'mice_lr'])}]", "tracking.enabled=false", "n_jobs=1",
        *overrides]))


def actors_of(judge: str, records: Path) -> list[str]:
    """The actors the judge judged: STE's published agents (not the judges' own calls, also judged there)."""
    return sorted(p.name.removeprefix("ste-").removesuffix(f"-judged-by-{judge}.jsonl.gz")
                  for p in records.glob(f"ste-*-judged-by-{judge}.jsonl.gz")
                  if not any(p.name.startswith(f"ste-{j}-") for j in JUDGES))


def pick(study, key: str) -> Candidate:
    """The study's estimator of ``key``: its own (MICE RF) or a reference row's."""
    return next(c for c in (study.main, *study.references) if c.key == key)


def long_rows(table: str, actor: str, judge: str, row: str, estimator: str, protocol: str, ids, p, y) -> pd.DataFrame:
    return pd.DataFrame({"table": table, "dataset": "ste", "llm": f"{actor} <- {judge}", "actor": actor,
                         "judge": judge, "row": row, "estimator": estimator, "protocol": protocol,
                         "run_id": f"{table}-{judge}", "id": ids, "confidence": p, "label": y})


def localisation(pipe: Pipeline, actor: str, judge: str, fs) -> list[dict]:
    """On the actor's wrong test calls to the right API: how often the argument each rule is least sure of (the one
    a gate asks the user about) is a wrong one, beside an argument picked at random."""
    from mice_exp.features.arguments import CONFIDENCES
    from mice_exp.tracking.schema import ARGUMENT, span_key

    m = pipe.argument_scores(fs.stage.records).metrics
    return [{"actor": actor, "judge": judge, "rule": rule, "localization": m[span_key(ARGUMENT, "localization", rule)],
             "random argument": m[span_key(ARGUMENT, "localization_chance")],
             "argument AUROC": m[span_key(ARGUMENT, "auroc", rule)], "arguments": m[span_key(ARGUMENT, "n")]}
            for rule in CONFIDENCES]


def judge_tables(judge: str, out: Path, records: Path = RECORDS, overrides: list[str] = ()
                 ) -> tuple[list[dict], list[pd.DataFrame], list[dict]]:
    """Every table row of one judge, their test predictions in the long shape of the report, and each actor's
    argument localisation."""
    actors = actors_of(judge, records)
    pipelines = {a: pipeline_for(judge, a, records, list(overrides)) for a in actors}
    outputs = {a: pipe.stage_output() for a, pipe in pipelines.items()}
    scored = pipelines[actors[0]].view.warm(list(outputs.values()))  # the actors' distinct calls' BERTScores, once
    print(f"{judge}: BERTScores of {scored} distinct judged calls", flush=True)
    sets = {a: pipe.features(outputs[a], pipe.confidence_sources(outputs[a])) for a, pipe in pipelines.items()}
    rows, preds, places = [], [], []
    pooled = {key: clone(pick(pipelines[actors[0]].study, key).estimator) for key in MICE}
    train_x = np.concatenate([fs.X[fs.rows("train")] for fs in sets.values()])
    train_y = np.concatenate([fs.labels[fs.rows("train")] for fs in sets.values()])
    for key in MICE:
        pooled[key].fit(train_x, train_y)
    for a in actors:
        pipe, fs = pipelines[a], sets[a]
        study, test = pipe.study, fs.rows("test")
        ids, y = np.array(fs.ids)[test], fs.labels[test]
        places += localisation(pipe, a, judge, fs)
        outcome = pipe.protocol.run(study, fs)  # per actor: raw, HRE, NWKR, MICE LR, MICE RF (marks on MICE RF)
        refs = {r.key: r for r in outcome.rows}
        scored = list(outcome.rows)
        for key in MICE:  # MICE LR's marks too: score it as the main row once
            if key != "mice_rf":
                scored[scored.index(refs[key])] = study.score(
                    [(c, refs[c.key].p, None) for c in study.references if c.key != key]
                    + [(pick(study, key), refs[key].p, None)], y)[-1]
        others = [b for b in actors if b != a]
        x_other = np.concatenate([sets[b].X[sets[b].rows("train")] for b in others])
        y_other = np.concatenate([sets[b].labels[sets[b].rows("train")] for b in others])
        for protocol, fitted in (("leave-one-actor-out", None), ("pooled", pooled)):
            for key in MICE:
                model = fitted[key] if fitted else clone(pick(study, key).estimator).fit(x_other, y_other)
                p = model.predict_proba(fs.X[test])[:, 1]
                cand = Candidate(f"{key}_{protocol}", f"{NAMES[key]} ({protocol})", model)
                scored.append(study.score([(c, refs[c.key].p, None) for c in study.references if c.key in ("hre", "nwkr")]
                                          + [(cand, p, None)], y)[-1])
        for r in scored:
            protocol = "holdout" if r.key in NAMES else r.key.split("_", 2)[-1]
            base = r.key if r.key in NAMES else "_".join(r.key.split("_")[:2])
            rows.append({"actor": a, "judge": judge, "row": r.name, "estimator": r.key, "protocol": protocol,
                         "n_test": len(y), "accuracy": float(np.mean(y)),
                         **{m: r.metrics[m] for m in METRICS}, "marks": "".join(sorted(set("".join(r.marks.values())))),
                         **{f"mark_{m}": r.marks.get(m, "") for m in METRICS if m in r.marks},
                         **{f"always_execute_{k}": etcu(np.ones(len(y)), y, risk) for k, risk in PAPER_RISKS.items()}})
            preds.append(long_rows("actors", a, judge, r.name, r.key, "holdout" if base == r.key else protocol,
                                   ids, r.p, y))
    pipe = pipelines[actors[0]]
    folder = out / f"gate-{judge}"
    save_gate(folder, pipe, pooled["mice_rf"], sets[actors[0]].view, pipe.demo_pool(),
              llm_stage={k: sets[actors[0]].stage.info[k] for k in ("n_layers", "hidden_size")},
              provenance={"fitted_on": "the training calls of every actor in experiments/actors", "actors": actors,
                          "train_rows": int(len(train_y)), "render": "canonical"},
              arguments=pipe.argument_rule([r for o in outputs.values() for r in o.records]))
    return rows, preds, places


def own_calls(judge: str, records: Path, overrides: list[str]) -> list[dict]:
    """What canonical rendering does to a judge's own Table 1: its published records (each call scored as the judge
    wrote it) against the same calls rendered canonically and teacher-forced, on the calls that parse (the only ones
    rendered), the same split; raw, HRE, NWKR, MICE LR and MICE RF, fitted and scored the same way."""
    from dataclasses import replace

    canonical = judged_path(records, "ste", judge, judge)
    if not canonical.is_file():
        return []
    rows, keep = [], set(read_records_file(canonical, "ste").ids)
    for layout, path, actor in (("as written (published)", ROOT / "experiments" / "records" / f"ste-{judge}.jsonl.gz",
                                 None), ("canonical", canonical, judge)):
        pipe = Pipeline.from_config(compose_config([
            f"llm={judge}", f"llm.records={path}", "estimator=mice_rf", "compare_with=[raw,hre,nwkr,mice_lr]",
            "tracking.enabled=false", "n_jobs=1", *([f"actor={actor}"] if actor else []), *overrides]))
        output = pipe.stage_output()
        kept = [r for r in output.records if r["id"] in keep]
        if len(kept) < len(output.records):
            output = replace(output, records=kept, key=f"{output.key}-parsed-{len(kept)}")
        fs = pipe.features(output)
        for r in pipe.protocol.run(pipe.study, fs).rows:
            y = fs.labels[fs.rows("test")]
            rows.append({"judge": judge, "layout": layout, "row": r.name, "n_test": len(y),
                         "accuracy": float(np.mean(y)), **{m: r.metrics[m] for m in METRICS},
                         "marks": "".join(sorted(set("".join(r.marks.values()))))})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--judges", default=",".join(JUDGES))
    parser.add_argument("--out", default=str(ROOT / "experiments" / "actors"))
    parser.add_argument("--records", default=str(RECORDS), help="the folder of the judged records")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run (a check: dataset.max_apis=6)")
    args = parser.parse_args()
    records = Path(args.records)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, preds, own, places = [], [], [], []
    for judge in args.judges.split(","):
        own += own_calls(judge, records, args.overrides)
        if not actors_of(judge, records):
            print(f"{judge}: no judged records in {records}; run mice-exp records llm={judge} actor=all first")
            continue
        r, p, where = judge_tables(judge, out, records, args.overrides)
        rows += r
        preds += p
        places += where
    judges = args.judges.split(",")
    table = with_other_judges(out / "rows.csv", pd.DataFrame(rows), judges)
    long = with_other_judges(out / "predictions.csv", pd.concat(preds, ignore_index=True), judges)
    own = with_other_judges(out / "own_calls.csv", pd.DataFrame(own), judges)
    located = with_other_judges(out / "localization.csv", pd.DataFrame(places), judges)
    long.to_csv(out / "predictions.csv", index=False)
    table.to_csv(out / "rows.csv", index=False)
    gains = paper_terms(long, references=("raw",))
    gains.to_csv(out / "gains.csv", index=False)
    own.to_csv(out / "own_calls.csv", index=False)
    located.to_csv(out / "localization.csv", index=False)
    summary = summarise(table, gains)
    summary.to_csv(out / "summary.csv", index=False)
    located = located.groupby(["judge", "rule"], as_index=False)[["localization", "random argument"]].mean()
    text = "\n\n".join([f"# Every row of every actor x judge ({' '.join(['python', *sys.argv])})", markdown(table),
                         "## Summary", md(summary), "## Own calls, as written and canonical",
                         md(own) if len(own) else "(none)", "## Argument localisation", md(located)])
    (out / "tables.md").write_text(text + "\n")
    print(text)


def with_other_judges(path: Path, frame: pd.DataFrame, judges: list[str]) -> pd.DataFrame:
    """``frame`` (this run's judges) after the rows of the other judges that ``path`` already holds: each judge's
    tables take an hour of CPU, so a run for one judge keeps what a run for the other wrote."""
    if not path.is_file():
        return frame
    held = pd.read_csv(path)
    return pd.concat([held[~held["judge"].isin(judges)], frame], ignore_index=True)


def md(frame: pd.DataFrame) -> str:
    """A frame as a markdown table, floats to three decimals."""
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    return "\n".join(["| " + " | ".join(map(str, frame.columns)) + " |", "|---" * len(frame.columns) + "|",
                      *("| " + " | ".join(row) + " |" for row in cells)])


def summarise(table: pd.DataFrame, gains: pd.DataFrame) -> pd.DataFrame:
    """One line per (actor, judge): accuracy, the best row by AUC-ETCU, its gain over raw confidence (with the
    bootstrap interval) and over always executing at each risk, and the leave-one-actor-out MICE RF beside it."""
    out = []
    for (actor, judge), block in table.groupby(["actor", "judge"], sort=True):
        best = block.loc[block["auc_etcu"].idxmax()]
        raw = block[block["estimator"] == "raw"].iloc[0]
        loao = block[block["estimator"] == "mice_rf_leave-one-actor-out"].iloc[0]
        gain = gains[(gains["llm"] == f"{actor} <- {judge}") & (gains["estimator"] == best["estimator"])]
        entry = {"actor": actor, "judge": judge, "n_test": int(best["n_test"]), "accuracy": best["accuracy"],
                 "best row": best["row"], "AUC-ETCU": best["auc_etcu"],
                 "gain vs raw": best["auc_etcu"] - raw["auc_etcu"]}
        if len(gain):
            entry["95% interval"] = (f"[{gain['gain_auc_etcu_vs_raw_lo'].iloc[0]:+.3f}, "
                                     f"{gain['gain_auc_etcu_vs_raw_hi'].iloc[0]:+.3f}]")
        for risk in ("low", "medium", "high"):
            entry[f"vs always, {risk}"] = best[f"etcu_{risk}"] - best[f"always_execute_{risk}"]
        entry["LOAO MICE RF AUC-ETCU"] = loao["auc_etcu"]
        entry["LOAO gain vs raw"] = loao["auc_etcu"] - raw["auc_etcu"]
        out.append(entry)
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame) -> str:
    """The README's tables: one block per (judge, actor), and the one-line-per-actor summary."""
    lines = ["| actor | judge | acc. | row | smECE | Brier | AUROC | Low | Medium | High | AUC-ETCU |", "|---" * 11 + "|"]
    for t in table.itertuples():
        lines.append(f"| {t.actor} | {t.judge} | {t.accuracy:.2f} | {t.row} | {t.smece:.3f} | {t.brier:.3f} | "
                     f"{t.auroc:.3f} | {t.etcu_low:.3f} | {t.etcu_medium:.3f} | {t.etcu_high:.3f} | "
                     f"{t.auc_etcu:.3f} {t.marks if isinstance(t.marks, str) else ''} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
