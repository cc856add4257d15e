"""What one job prints and logs into its tracked run: the LLM stage's summary, then the protocol's outcome (Table-1
rows and their metrics, the action-belief and per-argument scores, the field diagnostics, predictions, figures) and
the gate; it computes nothing the outcome does not hold. The report (:mod:`mice_exp.report`) reads finished runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from mice_exp.estimation import feature_weights
from mice_exp.gate.build import save_run_gate
from mice_exp.gate.command import usage_hint
from mice_exp.metrics import TAU_GRID, TRIVIAL_POLICIES, etcu_curve
from mice_exp.metrics.calibration import wilson_interval
from mice_exp.tracking import schema
from mice_exp.tracking.store import is_enabled, tracking_uri

if TYPE_CHECKING:  # annotations only
    from mice_exp.estimation import Row
    from mice_exp.features import FeatureSet
    from mice_exp.llm.records import Record, StageOutput
    from mice_exp.pipeline import Pipeline
    from mice_exp.protocols import Outcome

MAX_APIS_LISTED = 10  # accuracy per API is printed up to this many APIs
#: Fewer test calls than this cannot separate the estimators (one call moves a cell by 1/n).
FEW_TEST_CALLS = 100


def label_counts(records: list[Record]) -> dict[str, dict[str, int]]:
    """Correct / incorrect / unparseable counts per split."""
    counts: dict[str, dict[str, int]] = {}
    for row in records:
        split = counts.setdefault(row["split"], {"correct": 0, "incorrect": 0, "parse_errors": 0})
        split["correct" if row["label"] else "incorrect"] += 1
        split["parse_errors"] += row["parse_error"] is not None
    return counts


def llm_summary(name: str, records: list[Record]) -> str:
    total = len(records)
    correct = sum(r["label"] for r in records)
    lines = [f"{name}: {correct}/{total} tool calls correct (accuracy {correct / max(total, 1):.3f})"]
    for split, c in sorted(label_counts(records).items()):
        lines.append(f"  {split:<10} correct {c['correct']:>4}  incorrect {c['incorrect']:>4}  "
                     f"(unparseable {c['parse_errors']})")
    apis = sorted({r["api"] for r in records})
    if len(apis) <= MAX_APIS_LISTED:  # BFCL's categories: is each one worth a full run?
        for api in apis:
            labels = [r["label"] for r in records if r["api"] == api]
            low, high = wilson_interval(sum(labels), len(labels))
            lines.append(f"  {api}: {sum(labels)}/{len(labels)} correct (accuracy {sum(labels) / len(labels):.3f}, "
                         f"95% interval {low:.2f}-{high:.2f})")
    return "\n".join(lines)


def small_test_note(n_test: int, llm: str, root: Path) -> str | None:
    """What a table on a handful of test calls (make run's 12) can and cannot say, and where the real one is."""
    if n_test >= FEW_TEST_CALLS:
        return None
    note = (f"note: {n_test} test calls cannot separate these estimators (one call moves a cell by 1/{n_test}; "
            "the ranking above is noise).")
    records = Path("experiments") / "records" / f"ste-{llm}.jsonl.gz"
    if (root / records).is_file():
        note += (" Table 1 on all 750 STE calls from the published records, no LLM:\n"
                 f"  mice-exp llm={llm} llm.records={records} estimator=mice_rf")
    return note


def log_stage(pipeline: Pipeline, output: StageOutput, tracker: Any) -> dict[str, Any]:
    """Print and log the LLM stage's accuracy; what the job returns about it."""
    info = output.info
    print("\n" + llm_summary(pipeline.study.llm, output.records))
    tracker.log_metrics({"llm_accuracy": info["accuracy"], "llm_examples": info["examples"],
                         "prompts_with_dropped_demos": info["prompts_with_dropped_demos"]})
    return {"llm_accuracy": info["accuracy"], "llm_examples": info["examples"],
            "llm_cache": str(output.folder or pipeline.stage.llm.records)}


def log_outcome(pipeline: Pipeline, output: StageOutput, fs: FeatureSet, outcome: Outcome,
                tracker: Any) -> dict[str, Any]:
    """Print the protocol's text and log its metrics, tables and figures; with Table-1 rows, everything
    :func:`log_rows` logs (``objective``: the run's estimator's AUC-ETCU)."""
    print("\n" + outcome.text)
    if (note := small_test_note(int(fs.rows("test").sum()), pipeline.stage.llm.name, pipeline.paths.root)):
        print(note)
    for name, frame in outcome.tables.items():
        tracker.log_table(frame, name)
    for name, figure in outcome.figures.items():
        tracker.log_figure(figure, name)
    if outcome.regions is not None:
        from mice_exp.report.figures import region_reliability  # matplotlib

        regions = outcome.regions
        for region, figure in region_reliability(regions.confidence, regions.labels, regions.regions).items():
            tracker.log_figure(figure, schema.field_region_figure(region))
    return log_rows(pipeline, output, fs, outcome, tracker) if outcome.rows else {}


def log_rows(pipeline: Pipeline, output: StageOutput, fs: FeatureSet, outcome: Outcome, tracker: Any) -> dict[str, Any]:
    """What a run with Table-1 rows logs: every row's metrics (the reference rows as ``baseline.*``) and the
    outcome's own (action belief, per-argument scores, field diagnosis), the predictions and figures, and the gate
    of the fitted estimator."""
    rows = outcome.rows
    metrics = dict(rows[-1].metrics)
    for row in rows[:-1]:
        metrics |= {schema.baseline_key(row.key, k): v for k, v in row.metrics.items()}
    metrics |= outcome.metrics
    tracker.log_metrics(metrics)
    log_outputs(tracker, rows, fs, pipeline.study.llm)

    saved = save_run_gate(pipeline, output, fs, rows[-1].estimator, tracker)
    if saved:
        where = str(saved.get("uri") or saved.get("folder"))
        uri = tracking_uri(pipeline.tracking, pipeline.paths.root) if is_enabled(pipeline.tracking) else None
        print(f"gate saved: {where} ({usage_hint(where, uri)})")
    return metrics | {"objective": rows[-1].metrics[schema.OBJECTIVE]}


def log_outputs(tracker: Any, rows: list[Row], fs: FeatureSet, title: str) -> None:
    """Predictions table and the paper's figures as artifacts of the run (``title``: the LLM's display name)."""
    from mice_exp.report import figures  # matplotlib

    test = fs.rows("test")
    y = fs.labels[test]
    frame = pd.DataFrame({"id": np.array(fs.ids)[test], "api": fs.apis[test], "label": y})
    for row in rows:
        frame[schema.prediction_column(row.key)] = row.p
    tracker.log_table(frame, schema.PREDICTIONS)
    main = rows[-1]
    tracker.log_figure(figures.reliability_diagram(main.p, y, title=main.name), schema.RELIABILITY_FIGURE)
    curves = {row.name: etcu_curve(row.p, y, TAU_GRID) for row in rows}
    policies = {name: etcu_curve(policy(y), y, TAU_GRID) for name, policy in TRIVIAL_POLICIES.items()}
    tracker.log_figure(figures.etcu_curves(curves, TAU_GRID, policies, title=title), schema.ETCU_FIGURE)
    tracker.log_figure(figures.risk_coverage_curves({row.name: row.p for row in rows}, y, title=title),
                       schema.RISK_COVERAGE_FIGURE)
    weights = feature_weights(main, fs.columns)
    if weights is not None:
        tracker.log_figure(figures.feature_weights(fs.columns, weights[0], kind=weights[1], title=main.name),
                           schema.FEATURE_WEIGHTS_FIGURE)
    if fs.layer_scores is not None:
        layers = list(range(1, fs.layer_scores.shape[1] + 1))
        tracker.log_figure(figures.layer_score_distributions(fs.layer_scores, fs.labels, layers, title=title),
                           schema.LAYER_SCORES_FIGURE)

