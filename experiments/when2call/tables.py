"""When2Call's tables from the run outputs: the MCQ metrics beside the paper's, the generated replies' classes, and
the action-belief gap of "call now" against the truth ``correct_answer == tool_call``.

    python experiments/when2call/tables.py experiments/when2call/mcq-*.json \\
        --records experiments/records/when2call-smollm2_135m.jsonl.gz experiments/records/when2call-gemma3_270m.jsonl.gz

Each MCQ file is ``mice-exp mcq``'s output; a records file (``mice-exp records dataset=when2call``) is matched to
it by its LLM. Markdown on stdout (``--out FILE`` writes it too). Every confidence is scored as it is, on all items
and on the test split (items of one BFCL source share a split), but one: the MCQ's four per-character
log-likelihoods calibrated by a logistic regression fitted on the training split, scored on the test split only.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mice_exp.data.labels import made_call
from mice_exp.data.when2call import ANSWERS, CLASSES, REPLY_CLASSES, classify_reply
from mice_exp.llm.records import read_records_file
from mice_exp.metrics import auc_etcu, auroc, smece, smece_rows
from mice_exp.metrics.bootstrap import bootstrap_intervals
from mice_exp.metrics.choices import (NORMALISATIONS, choice_probability, choice_scores, class_f1,
                                      hallucination_rate, macro_f1, margin)

#: The When2Call README's MCQ table (NVIDIA/When2Call at ecc8d42, "Results / MCQ"; the paper's Table 3): models
#: of 1.5B parameters or fewer, on the 3,652-item MCQ test set, each with its own prompt variant.
#: (model, macro F1, acc_norm %, tool hallucination %)
PAPER = (("Qwen 2.5 0.5B Instruct", 32.0, 53.5, 20.0), ("Llama 3.2 1B Instruct", 21.7, 45.1, 43.0),
         ("xLAM 1B FC-R", 25.6, 45.7, 40.0), ("Qwen 2.5 1.5B Instruct", 29.9, 52.6, 23.0))
CALL = ANSWERS.index("tool_call")
RESAMPLES = 1000  # bootstrap resamples of each confidence's AUROC and smECE


def percent(share: float) -> str:
    return "-" if np.isnan(share) else f"{100 * share:.1f}"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


def load_mcq(path: Path) -> dict[str, Any]:
    run = json.loads(path.read_text())
    items = run["items"]
    run["loglik"] = np.array([[i["loglik"][a] for a in ANSWERS] for i in items])
    run["chars"] = np.array([[i["chars"][a] for a in ANSWERS] for i in items])
    run["gold"] = [i["class"] for i in items]
    run["name"] = f"{run['display']} ({run['template']})"
    return run


def mcq_tables(runs: Sequence[dict[str, Any]]) -> str:
    """Accuracy, macro F1 and tool-hallucination rate under both normalisations, per-class F1, the paper's rows."""
    rows, per_class = [], []
    for run in runs:
        for norm in NORMALISATIONS:
            pred = [ANSWERS[k] for k in choice_scores(run["loglik"], run["chars"], norm).argmax(1)]
            n_tools = [i["n_tools"] for i in run["items"]]
            rows.append((run["name"], norm, len(pred), float(np.mean(np.array(pred) == np.array(run["gold"]))),
                         percent(macro_f1(run["gold"], pred)), percent(hallucination_rate(run["gold"], pred, n_tools)),
                         ", ".join(f"{a} {c}" for a, c in sorted(Counter(pred).items()))))
            f1 = class_f1(run["gold"], pred)
            per_class.append((run["name"], norm, *(percent(f1[a]) if a in f1 else "-" for a in ANSWERS)))
    paper = [(model, "paper: `sum` F1, acc_norm", "3,652", f"{acc / 100:.3f} (acc_norm)", f"{f1:.1f}",
              f"{hall:.1f}", "") for model, f1, acc, hall in PAPER]
    return "\n\n".join([
        "### MCQ (When2Call's metrics; `sum`: lm-eval's acc, `chars`: acc_norm; F1 and rate x 100)",
        table(("LLM (template)", "choice by", "items", "accuracy", "macro F1", "tool hall. %", "chosen"),
              rows + paper),
        "### Per-class F1 (x 100; -: neither true nor chosen)",
        table(("LLM (template)", "choice by", *ANSWERS), per_class)])


def called(record: dict[str, Any]) -> bool:
    """Whether a reply holds a call, as the labels read it (a name with parsed arguments; a reply that only
    echoes the format's ``Action:`` line is none)."""
    return made_call(record["pred_api"], record["pred_args"])


def generation_table(records: dict[str, list[dict[str, Any]]]) -> str:
    """The generated replies' classes (:func:`classify_reply`) per true class."""
    rows = []
    for llm, recs in records.items():
        for truth in CLASSES:
            counts = Counter(classify_reply(r["text"], called(r)) for r in recs if r["api"] == truth)
            rows.append((llm, truth, sum(counts.values()), *(counts[c] for c in REPLY_CLASSES)))
    return "### Generated replies by true class\n\n" + table(("LLM", "true class", "items", *REPLY_CLASSES), rows)


def belief_rows(label: str, p: np.ndarray, y: np.ndarray, splits: np.ndarray, probability: bool,
                scopes: Sequence[str] = ("all", "test")) -> list[tuple]:
    """One row per scope (all items, test split): n, share where a call is right, AUROC, smECE and AUC-ETCU
    (the last two for probabilities only), then 95% bootstrap intervals of AUROC and smECE."""
    out = []
    for scope in scopes:
        keep = np.ones(len(y), dtype=bool) if scope == "all" else splits == scope
        pk, yk = p[keep], y[keep]
        if not len(yk):
            continue
        calib = (smece(pk, yk), auc_etcu(pk, yk)) if probability else ("-", "-")
        ranked = pk if probability else 1 / (1 + np.exp(-pk))  # AUROC reads the order only; auroc wants [0, 1]
        metrics = {"auroc": auroc} | ({"smece": smece} if probability else {})
        spans = bootstrap_intervals(ranked, yk, metrics, RESAMPLES, rows_metrics={"smece": smece_rows})
        out.append((label, scope, len(yk), float(yk.mean()), auroc(ranked, yk), *calib,
                    *(f"[{spans[m][0]:.2f}, {spans[m][1]:.2f}]" if m in spans else "-" for m in ("auroc", "smece"))))
    return out


def fitted_call_now(scores: np.ndarray, y: np.ndarray, splits: np.ndarray) -> np.ndarray | None:
    """P(a call is right) for every item from a logistic regression on the four answers' per-character
    log-likelihoods (``scores``, [N, 4]), fitted on the training split: the MCQ's belief, calibrated on what the
    training items say (None where the training split holds one class only)."""
    from sklearn.linear_model import LogisticRegression

    train = splits == "train"
    if len(set(y[train])) < 2:
        return None
    return LogisticRegression().fit(scores[train], y[train]).predict_proba(scores)[:, 1]


def belief_tables(runs: Sequence[dict[str, Any]], records: dict[str, list[dict[str, Any]]]) -> str:
    """The confidence that a call is the right move against ``class == tool_call``, the calls made against it and
    the calls withheld against it (both directions of the action-belief gap)."""
    rows, against, withheld = [], [], []
    for run in runs:
        y = np.array([g == "tool_call" for g in run["gold"]], dtype=float)
        splits = np.array([i["split"] for i in run["items"]])
        p_call = choice_probability(run["loglik"], CALL)
        per_char = choice_scores(run["loglik"], run["chars"], "chars")
        rows += belief_rows(f"{run['name']}: MCQ P(tool_call)", p_call, y, splits, True)
        rows += belief_rows(f"{run['name']}: MCQ margin (chars)",
                            margin(per_char, CALL), y, splits, False)
        if (fitted := fitted_call_now(per_char, y, splits)) is not None:
            rows += belief_rows(f"{run['name']}: MCQ scores, fitted on train", fitted, y, splits, True, ("test",))
        recs = {r["id"]: r for r in records.get(run["llm"], [])}
        if not recs:
            continue
        index = [n for n, i in enumerate(run["items"]) if i["id"] in recs and called(recs[i["id"]])]
        silent = [n for n, i in enumerate(run["items"]) if i["id"] in recs and not called(recs[i["id"]])]
        by_chars = per_char.argmax(1)
        prefers = by_chars == CALL
        for belief, says_yes in (("MCQ prefers tool_call (chars)", prefers[silent]),
                                 ("MCQ P(tool_call) >= 0.5", p_call[silent] >= 0.5)):
            withheld.append((run["name"], len(recs), len(silent), belief, int(says_yes.sum()),
                             int(np.sum(says_yes & (y[silent] == 1)))))
        calls = [recs[run["items"][n]["id"]] for n in index]
        raw = np.array([r["raw_confidence"] for r in calls])
        rows += belief_rows(f"{run['name']}: raw confidence (its calls)", raw, y[index], splits[index], True)
        p_true = [r.get("sources", {}).get("p_true") for r in calls]
        if calls and all(v is not None for v in p_true):
            rows += belief_rows(f"{run['name']}: P(True) (its calls)", np.array(p_true, dtype=float), y[index],
                                splits[index], True)
        chosen = by_chars[index]
        for belief, says_no in (("MCQ prefers another answer (chars)", chosen != CALL),
                                ("MCQ P(tool_call) < 0.5", p_call[index] < 0.5), ("raw confidence < 0.5", raw < 0.5)):
            wrong = int(np.sum(says_no & (y[index] == 0)))
            against.append((run["name"], len(recs), len(index), belief, int(says_no.sum()), wrong))
    parts = ["### Is a call the right move? (truth: correct_answer == tool_call)",
             table(("confidence", "items", "n", "call right", "AUROC", "smECE", "AUC-ETCU", "AUROC 95%",
                    "smECE 95%"), rows)]
    if against:
        parts += ["### Calls made when its own confidence says not to",
                  table(("LLM (template)", "replies", "calls", "confidence says no when", "such calls",
                         "of them wrong"), against)]
    if withheld:
        parts += ["### No call made when its own confidence says to call",
                  table(("LLM (template)", "replies", "no call", "confidence says call when", "such replies",
                         "of them where a call was right"), withheld)]
    return "\n\n".join(parts)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mcq", nargs="+", type=Path, help="mice-exp mcq outputs (JSON)")
    parser.add_argument("--records", nargs="*", type=Path, default=[], help="records files of dataset=when2call")
    parser.add_argument("--out", type=Path, help="also write the tables here")
    args = parser.parse_args(argv)
    runs = [load_mcq(path) for path in args.mcq]
    records = {}
    for path in args.records:
        output = read_records_file(path, "when2call")
        records[output.info["llm"]] = output.with_sources()
    parts = [mcq_tables(runs)] + ([generation_table(records)] if records else []) + [belief_tables(runs, records)]
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
