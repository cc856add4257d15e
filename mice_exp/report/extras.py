"""Report sections beyond Tables 1 and 2, each built from the runs that carry its results:

* sample efficiency (MICE Figure 7): runs of ``protocol=sample_efficiency`` and their
  ``sample_efficiency.csv`` artifact;
* risk sweep: ETCU of every estimator at each ``risk.fp`` of ``risk=custom`` runs;
* action-belief consistency (Pal et al.): the ``agent.*`` and ``action_belief.*`` metrics;
* miscalibration field (Kobalczyk & van der Schaar): the ``field.*`` metrics of ``estimator=field`` runs;
* per-argument confidence: the ``argument.*`` and ``api_name.*`` metrics every STE, jsonl or BFCL run logs;
* trajectories: the ``trajectory.*`` metrics of runs on a multi-turn data set's steps.

Like the rest of the report this reads MLflow only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mice_exp.compose import estimator_names
from mice_exp.metrics import PAPER_RISKS, Risk
from mice_exp.report.collect import Predictions
from mice_exp.report.plots import slug
from mice_exp.report.tables import ESTIMATOR_ORDER, MICE_ORDER, fmt
from mice_exp.tracking.schema import (
    API_NAME,
    ARGUMENT,
    RISK_TAG,
    SPAN_CONFIDENCES,
    SAMPLE_EFFICIENCY_CSV,
    SAMPLE_EFFICIENCY_FITS_CSV,
    action_belief_key,
    agent_key,
    baseline_key,
    field_key,
    parse_action_belief_key,
    parse_baseline_key,
    parse_trajectory_key,
    span_key,
    trajectory_key,
)


@dataclass
class Section:
    """One Markdown section, its rows for results.csv (column ``table``), its figures and the tables it
    publishes beside them (file name -> rows)."""

    markdown: str
    frame: pd.DataFrame
    figures: dict[str, Figure] = field(default_factory=dict)
    files: dict[str, pd.DataFrame] = field(default_factory=dict)


def _latest(runs: Sequence[Any], key) -> list[Any]:
    """The newest run per ``key(run)`` (runs come newest first from MLflow)."""
    seen: dict[Any, Any] = {}
    for run in runs:
        seen.setdefault(key(run), run)
    return list(seen.values())


def _name(key: str, names: Mapping[str, str]) -> str:
    return names.get(key) or estimator_names().get(key, key)


def _in_table_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in Table 1's order (confidences and calibrators, then MICE, then the rest by key)."""
    order = [*ESTIMATOR_ORDER, *MICE_ORDER]
    rank = [(order.index(k), k) if k in order else (len(order), k) for k in frame["estimator"]]
    return frame.iloc[sorted(range(len(frame)), key=rank.__getitem__)]


def _markdown(frame: pd.DataFrame, columns: Mapping[str, str]) -> str:
    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "|".join(":---" if i < 2 else "---:" for i in
                                                                          range(len(columns))) + "|"]
    for values in frame[list(columns)].itertuples(index=False, name=None):
        lines.append("| " + " | ".join(v if isinstance(v, str) else fmt(v) for v in values) + " |")
    return "\n".join(lines)


def _new_figure(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Any]:
    fig = Figure(figsize=(6.0, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _names(runs: Sequence[Any]) -> dict[str, str]:
    return {run.data.tags.get("estimator", ""): run.data.params.get("estimator.name", "") for run in runs}


FITS_FILE = "sample_efficiency_fits.csv.gz"  # the report's copy of every run's fits, one file


def sample_efficiency(client, runs: Sequence[Any]) -> Section | None:
    """Mean (± std over groups and trials) AUC-ETCU per training size, per LLM."""
    from mice_exp.protocols.sample_efficiency import sample_efficiency_figure  # loads scipy, hydra

    chosen = _latest([r for r in runs if r.data.tags.get("protocol") == "sample_efficiency"],
                     lambda r: (r.data.tags.get("llm"), r.data.tags.get("dataset"), r.data.tags.get("features")))
    parts, frames, fits, figures = [], [], [], {}
    with (Predictions(client, SAMPLE_EFFICIENCY_CSV) as tables,
          Predictions(client, SAMPLE_EFFICIENCY_FITS_CSV) as scores):
        for run in chosen:
            table = tables(run.info.run_id)
            if table is None:
                continue
            llm = run.data.params.get("llm.display", run.data.tags.get("llm", ""))
            table = table.assign(llm=llm, run_id=run.info.run_id)
            frames.append(table)
            if (fitted := scores(run.info.run_id)) is not None:  # runs before 2026-11-26 logged the table only
                fits.append(fitted.assign(llm=llm, run_id=run.info.run_id))
            cells = table.assign(cell=[f"{m:.3f} ± {s:.3f}" for m, s in zip(table["mean"], table["std"])])
            wide = _in_table_order(cells.pivot(index="estimator", columns="size", values="cell").reset_index())
            wide["estimator"] = [_name(k, {}) for k in wide["estimator"]]
            header = {"estimator": "Estimator", **{c: f"n = {c}" for c in wide.columns[1:]}}
            name = f"sample_efficiency_{slug(run.data.tags.get('llm', 'llm'))}.png"
            figures[name] = sample_efficiency_figure(table, {k: _name(k, {}) for k in table["estimator"]}, llm)
            parts.append(f"### {llm}\n\n{_markdown(wide.astype(str), header)}\n\n![{name}]({name})")
    if not frames:
        return None
    body = ("## Sample efficiency (MICE Figure 7)\n\nAUC-ETCU on the test split against the training-set size: "
            "mean ± one standard deviation over disjoint training groups of that size and trials.\n\n"
            + "\n\n".join(parts))
    files = {FITS_FILE: pd.concat(fits, ignore_index=True)} if fits else {}
    if files:
        body += (f"\n\nEvery fit behind these cells (estimator, size, trial, group, test AUC-ETCU, fallback): "
                 f"`{FITS_FILE}`.")
    return Section(body, pd.concat(frames, ignore_index=True).assign(table="sample_efficiency"), figures, files)


def _baselines(metrics: dict[str, float]) -> list[tuple[str, str, float]]:
    """(estimator, metric, value) of every reference row a run logged."""
    return [(*parsed, value) for name, value in metrics.items() if (parsed := parse_baseline_key(name))]


def risk_sweep(runs: Sequence[Any]) -> Section | None:
    """ETCU at each false-positive cost of ``risk=custom`` holdout runs, every estimator and baseline."""
    chosen = _latest([r for r in runs if r.data.tags.get(RISK_TAG) == "custom" and "etcu_custom" in r.data.metrics
                      and r.data.tags.get("protocol") == "holdout"],
                     lambda r: (r.data.tags.get("llm"), r.data.tags.get("estimator"), r.data.params.get("risk.fp")))
    if not chosen:
        return None
    names, rows, paper = _names(chosen), [], True
    for run in chosen:
        risk = Risk(*(float(run.data.params[f"risk.{k}"]) for k in ("tp", "fp", "tn", "fn")))
        paper &= (risk.tp, risk.tn, risk.fn) == (1, 0, 0)
        llm = run.data.params.get("llm.display", run.data.tags.get("llm", ""))
        values = {run.data.tags["estimator"]: run.data.metrics["etcu_custom"]}
        values |= {key: v for key, metric, v in _baselines(run.data.metrics) if metric == "etcu_custom"}
        rows += [{"llm": llm, "llm_key": run.data.tags.get("llm", llm), "estimator": key, "fp": risk.fp,
                  "tau": risk.tau, "etcu": v} for key, v in values.items()]
    frame = pd.DataFrame(rows).drop_duplicates(["llm", "estimator", "fp"]).sort_values(["llm", "estimator", "tau"])
    parts, figures = [], {}
    for llm, block in frame.groupby("llm", sort=False):
        wide = _in_table_order(block.pivot(index="estimator", columns="tau", values="etcu").reset_index())
        wide["estimator"] = [_name(k, names) for k in wide["estimator"]]
        header = {"estimator": "Estimator", **{t: f"τ={t:.2f}" for t in wide.columns[1:]}}
        fig, ax = _new_figure(f"{llm}: utility against the cost of a false positive",
                              "τ = -fp / (1 - fp)" if paper else "τ, the runs' minimum-Bayes-risk threshold",
                              "ETCU (tp = 1, tn = fn = 0)" if paper else "ETCU")
        for key, line in block.groupby("estimator", sort=False):
            ax.plot(line["tau"], line["etcu"], marker="o", markersize=3, label=_name(key, names))
        ax.legend(fontsize=8)
        name = f"risk_sweep_{slug(block['llm_key'].iloc[0])}.png"
        figures[name] = fig
        parts.append(f"### {llm}\n\n{_markdown(wide, header)}\n\n![{name}]({name})")
    utilities = ("with tp = 1, tn = fn = 0 and a false positive costing fp, i.e. the minimum-Bayes-risk threshold "
                 "τ = -fp / (1 - fp)" if paper else "at each run's utilities, τ their minimum-Bayes-risk threshold")
    body = (f"## Utility against the risk level\n\nExpected tool-calling utility on the test split {utilities}; "
            "higher is better.\n\n" + "\n\n".join(parts))
    return Section(body, frame.assign(table="risk_sweep"), figures)


def action_belief(runs: Sequence[Any]) -> Section | None:
    """Spearman consistency and MBR agreement of the agent's own act / abstain choices, per confidence."""
    chosen = _latest([r for r in runs if agent_key("act_rate") in r.data.metrics],
                     lambda r: (r.data.tags.get("llm"), r.data.tags.get("dataset")))
    if not chosen:
        return None
    names, rows, parts = _names(chosen), [], []
    for run in chosen:
        m, llm = run.data.metrics, run.data.params.get("llm.display", run.data.tags.get("llm", ""))
        keys = dict.fromkeys(parsed[0] for parsed in map(parse_action_belief_key, m) if parsed)
        block = [{"llm": llm, "estimator": _name(k, names), "spearman": m[action_belief_key(k, "spearman")],
                  **{f"agree_{r}": m[action_belief_key(k, f"agree_{r}")] for r in PAPER_RISKS},
                  **{f"etcu_{r}": m.get(baseline_key(k, f"etcu_{r}"), m.get(f"etcu_{r}")) for r in PAPER_RISKS}}
                 for k in keys]
        rows += block
        header = {"estimator": "Confidence", "spearman": "Spearman ρ",
                  **{f"agree_{r}": f"agrees with MBR ({r})" for r in PAPER_RISKS},
                  **{f"etcu_{r}": f"its MBR utility ({r})" for r in PAPER_RISKS}}
        own = " / ".join(fmt(m[f"agent.etcu_{r}"]) for r in PAPER_RISKS)
        rate = m["agent.act_rate"]
        choice = ("never takes the way out, so ρ is undefined (–)" if rate == 1 else
                  "always takes the way out, so ρ is undefined (–)" if rate == 0 else "takes the way out on the rest")
        parts.append(f"### {llm}\n\nThe agent calls an API on {rate:.0%} of the test queries and {choice}; the "
                     f"utility of its own choices is {own} at low / medium / high risk.\n\n"
                     f"{_markdown(pd.DataFrame(block), header)}")
    body = ("## Action-belief consistency (Pal et al., 2026)\n\nSpearman ρ between the agent's non-abstention rate "
            "and each confidence over 10 equal-percentile confidence bins (+1: it acts exactly when confident, "
            "-1: the opposite); agreement: how often its choice equals each estimator's minimum-Bayes-risk "
            "decision; utility: the ETCU of acting on that estimator's decisions instead.\n\n" + "\n\n".join(parts))
    return Section(body, pd.DataFrame(rows).assign(table="action_belief"))


def miscalibration_field(runs: Sequence[Any]) -> Section | None:
    """Region sizes, worst-slice gap and the correction's effect for every field-corrected base estimator."""
    chosen = _latest([r for r in runs if field_key("frac_over") in r.data.metrics],
                     lambda r: (r.data.tags.get("llm"), r.data.tags.get("estimator"), r.data.tags.get("protocol")))
    if not chosen:
        return None
    rows = []
    for run in chosen:
        m, base = run.data.metrics, run.data.params.get("estimator.base", "")
        rows.append({
            "llm": run.data.params.get("llm.display", run.data.tags.get("llm", "")), "base": _name(base, {}),
            "n_test": m.get(field_key("n_test"), np.nan), "over": m[field_key("frac_over")],
            "under": m[field_key("frac_under")], "gap": m[field_key("worst_slice_gap")],
            "smece_base": m[field_key("smece_all_base")], "smece_field": m[field_key("smece_all_field")],
            "brier_base": m[field_key("brier_all_base")], "brier_field": m[field_key("brier_all_field")],
            "auc_base": m.get(baseline_key(base, "auc_etcu"), np.nan), "auc_field": m["auc_etcu"],
            "alpha": m.get(field_key("alpha"), np.nan), "run_id": run.info.run_id})
    frame = pd.DataFrame(rows).sort_values(["llm", "base"])
    shown = frame.assign(n_test=[str(int(n)) if n == n else "" for n in frame["n_test"]],
                         over=[f"{v:.0%}" for v in frame["over"]], under=[f"{v:.0%}" for v in frame["under"]])
    header = {"llm": "Model", "base": "Base estimator", "n_test": "test n", "over": "overconfident",
              "under": "underconfident", "gap": "worst-slice gap", "smece_base": "smECE base",
              "smece_field": "smECE corrected", "brier_base": "Brier base", "brier_field": "Brier corrected",
              "auc_base": "AUC-ETCU base", "auc_field": "AUC-ETCU corrected", "alpha": "α"}
    body = ("## Hidden miscalibration regimes (Kobalczyk & van der Schaar, 2026)\n\nShare of test calls in the "
            "over- (δ̂ < -ε) and underconfident (δ̂ > ε) regions of each base estimator's field, the worst-slice "
            "gap (worst region's smECE minus the global one; 0 when no region has enough points), and the local "
            "correction's effect on test (α = 0: validation chose no correction).\n\n" + _markdown(shown, header))
    return Section(body, frame.assign(table="field"))


SPANS = {ARGUMENT: "argument values", API_NAME: "API name"}
CONFIDENCE_NAMES = {"product": "token-probability product", "lens": "logit-lens agreement",
                    "min_token": "least likely token", "mean_token": "tokens' geometric mean"}


def argument_confidence(runs: Sequence[Any]) -> Section | None:
    """n, accuracy, AUROC, smECE (and localization for arguments) of each span confidence, per LLM.

    These depend on the LLM stage's records only, so the newest run per LLM and data set speaks for all.
    """
    chosen = _latest([r for r in runs if span_key(ARGUMENT, "n") in r.data.metrics],
                     lambda r: (r.data.tags.get("llm"), r.data.tags.get("dataset")))
    if not chosen:
        return None
    rows = []
    for run in chosen:
        m = run.data.metrics
        llm = run.data.params.get("llm.display", run.data.tags.get("llm", ""))
        for span, confidence in ((s, c) for s in SPANS for c in SPAN_CONFIDENCES):
            stat = {k: m.get(span_key(span, k, confidence), np.nan) for k in ("auroc", "smece", "localization")}
            stat["chance"] = m.get(span_key(span, "localization_chance"), np.nan)
            rows.append({"llm": llm, "dataset": run.data.tags.get("dataset", ""), "span": SPANS[span],
                         "confidence": CONFIDENCE_NAMES[confidence], "n": m.get(span_key(span, "n"), np.nan),
                         "accuracy": m.get(span_key(span, "accuracy"), np.nan), **stat, "run_id": run.info.run_id})
    frame = pd.DataFrame(rows).sort_values(["dataset", "llm"], kind="stable")
    shown = frame.assign(n=[str(int(n)) if n == n else "–" for n in frame["n"]])
    header = {"llm": "Model", "dataset": "Data", "span": "Span", "confidence": "Confidence", "n": "n", "accuracy": "accuracy",
              "auroc": "AUROC (↑)", "smece": "smECE (↓)", "localization": "localization (↑)",
              "chance": "random argument"}
    body = ("## Per-argument confidence\n\nOn the test calls: each top-level argument of a call to the gold API "
            "(right or wrong by the data set's rule) and each call's API name, scored by the product of its "
            "tokens' probabilities and by the share of logit-lens layers already predicting its tokens; "
            "localization: share of the calls with a wrong argument whose least confident argument is a wrong one "
            "(random argument: the same share for an argument picked at random). "
            "– : undefined (one class, or a records file without lens ids; the run's output says which).\n\n"
            + _markdown(shown, header))
    return Section(body, frame.assign(table="arguments"))


def trajectories(runs: Sequence[Any]) -> Section | None:
    """Each confidence's score of whole conversations (product / minimum of its steps) per LLM and data set."""
    chosen = _latest([r for r in runs if trajectory_key("", "n") in r.data.metrics],
                     lambda r: (r.data.tags.get("llm"), r.data.tags.get("dataset"), r.data.tags.get("estimator"),
                                r.data.tags.get("protocol")))
    if not chosen:
        return None
    names, rows = _names(chosen), []
    for run in chosen:
        m = run.data.metrics
        keys = dict.fromkeys(parsed[0] for parsed in map(parse_trajectory_key, m) if parsed)
        rows += [{"llm": run.data.params.get("llm.display", run.data.tags.get("llm", "")),
                  "dataset": run.data.tags.get("dataset", ""), "estimator": _name(k, names), "key": k,
                  "n": m[trajectory_key("", "n")], "right_rate": m[trajectory_key("", "right_rate")],
                  **{f"{a}_{s}": m.get(trajectory_key(k, f"{a}_{s}"), np.nan) for a in ("product", "min")
                     for s in ("brier", "log_loss", "smece", "auroc")}, "run_id": run.info.run_id} for k in keys]
    frame = pd.DataFrame(rows).drop_duplicates(["llm", "dataset", "key"])
    shown = frame.assign(n=[f"{int(n)} ({r:.0%} right)" for n, r in zip(frame["n"], frame["right_rate"])])
    header = {"llm": "Model", "dataset": "Data", "n": "test conversations", "estimator": "Confidence",
              **{f"{a}_{s}": f"{a} {label}" for a in ("product", "min") for s, label in
                 (("brier", "Brier (↓)"), ("log_loss", "log loss (↓)"), ("smece", "smECE (↓)"), ("auroc", "AUROC (↑)"))}}
    body = ("## Trajectories\n\nA test conversation's confidence, the product or the minimum of its steps' "
            "probabilities, against whether every one of its steps was right (each step after the gold history), "
            "scored by proper rules (Brier, log loss) beside smECE and AUROC.\n\n" + _markdown(shown, header))
    return Section(body, frame.assign(table="trajectory"))


def extra_sections(client, runs: Sequence[Any]) -> list[Section]:
    """Every extra section that ``runs`` (FINISHED, newest first) have results for."""
    found = [argument_confidence(runs), sample_efficiency(client, runs), risk_sweep(runs), action_belief(runs),
             miscalibration_field(runs), trajectories(runs)]
    return [section for section in found if section is not None]
