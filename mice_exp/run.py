"""The plain pipeline behind the Hydra entrypoint: ``run(cfg) -> dict`` (easy to call from tests).

LLM stage (cached) -> feature view (cached) -> protocol (estimators, metrics) -> log, all inside
one MLflow run that ends FINISHED or FAILED. Each step is an object the config names: the stage's
:class:`~mice_exp.llm.records.StageOutput`, the view (:func:`mice_exp.features.make_view`), the
protocol (:func:`mice_exp.protocols.make_protocol`) with the estimators of a
:class:`~mice_exp.estimation.Study`; this module only hands each one's output to the next and logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from mice_exp.compose import as_plain
from mice_exp.config import check_cache, check_config, check_data, keep_used_baselines
from mice_exp.errors import UserError
from mice_exp.llm.precision import resolve_dtype
from mice_exp.llm.records import StageOutput, read_records_file, read_stage, records_expect
from mice_exp.paths import Paths, paths_from
from mice_exp.tracking import schema
from mice_exp.tracking.sweeps import config_hash, finished_run_with_config


def label_counts(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Correct / incorrect / unparseable counts per split."""
    counts: dict[str, dict[str, int]] = {}
    for row in records:
        split = counts.setdefault(row["split"], {"correct": 0, "incorrect": 0, "parse_errors": 0})
        split["correct" if row["label"] else "incorrect"] += 1
        split["parse_errors"] += row["parse_error"] is not None
    return counts


MAX_APIS_LISTED = 10  # accuracy per API is printed up to this many APIs


def llm_summary(name: str, records: list[dict[str, Any]]) -> str:
    total = len(records)
    correct = sum(r["label"] for r in records)
    lines = [f"{name}: {correct}/{total} tool calls correct (accuracy {correct / max(total, 1):.3f})"]
    for split, c in sorted(label_counts(records).items()):
        lines.append(f"  {split:<10} correct {c['correct']:>4}  incorrect {c['incorrect']:>4}  "
                     f"(unparseable {c['parse_errors']})")
    apis = sorted({r["api"] for r in records})
    if len(apis) <= MAX_APIS_LISTED:  # BFCL's categories: is each one worth a full run?
        from mice_exp.metrics.calibration import wilson_interval

        for api in apis:
            labels = [r["label"] for r in records if r["api"] == api]
            low, high = wilson_interval(sum(labels), len(labels))
            lines.append(f"  {api}: {sum(labels)}/{len(labels)} correct (accuracy {sum(labels) / len(labels):.3f}, "
                         f"95% interval {low:.2f}-{high:.2f})")
    return "\n".join(lines)


def _log_outputs(tracker, rows, fs, cfg: dict[str, Any]) -> None:
    """Predictions table and the paper's figures as artifacts of the run."""
    from mice_exp.estimation import feature_weights
    from mice_exp.metrics import TAU_GRID, TRIVIAL_POLICIES, etcu_curve
    from mice_exp.report import figures

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
    tracker.log_figure(figures.etcu_curves(curves, TAU_GRID, policies, title=cfg["llm"]["display"]),
                       schema.ETCU_FIGURE)
    tracker.log_figure(figures.risk_coverage_curves({row.name: row.p for row in rows}, y, title=cfg["llm"]["display"]),
                       schema.RISK_COVERAGE_FIGURE)
    weights = feature_weights(main, fs.columns)
    if weights is not None:
        tracker.log_figure(figures.feature_weights(fs.columns, weights[0], kind=weights[1], title=main.name),
                           schema.FEATURE_WEIGHTS_FIGURE)
    if fs.layer_scores is not None:
        layers = list(range(1, fs.layer_scores.shape[1] + 1))
        tracker.log_figure(figures.layer_score_distributions(fs.layer_scores, fs.labels, layers,
                                                             title=cfg["llm"]["display"]),
                           schema.LAYER_SCORES_FIGURE)


def _diagnose_field(cfg: dict[str, Any], estimator, fs, tracker) -> dict[str, float]:
    """Where the base estimator is over- or underconfident on test (Kobalczyk & van der Schaar, Fig. 4-6)."""
    from mice_exp.protocols import inputs
    from mice_exp.report.figures import region_reliability

    if estimator.fallback_:  # it learned nothing (one training class): no field, no regions to show
        print("\nmiscalibration field: not fitted (the training labels are all one class); no diagnostics")
        return {}
    test = fs.rows("test")
    X = inputs(estimator, fs, cfg["estimator"].get("source", "raw"))[test]
    options = cfg["estimator"].get("diagnostics") or {}
    diagnosis = estimator.diagnose(X, fs.labels[test], eps=float(options.get("eps", 0.05)),
                                   min_region=int(options.get("min_region", 30)))
    for region, figure in region_reliability(estimator.base_confidence(X), fs.labels[test], diagnosis.regions).items():
        tracker.log_figure(figure, schema.field_region_figure(region))
    over, under = diagnosis.metrics["frac_over"], diagnosis.metrics["frac_under"]
    print(f"\nmiscalibration field on test: {over:.0%} overconfident, {under:.0%} underconfident, "
          f"worst-slice gap {diagnosis.metrics['worst_slice_gap']:.3f}; selected {estimator.selected()}")
    return {schema.field_key(k): v for k, v in diagnosis.metrics.items()} | {
        schema.field_key(k): v for k, v in estimator.selected().items()} | {schema.field_key("n_test"): int(test.sum())}


def load_stage(cfg: dict[str, Any], paths: Paths, splits: dict[str, str] | None = None) -> StageOutput:
    """The LLM stage's output: from a published records file (``llm.records``: no LLM loaded unless a
    view or estimator reads hidden states, which are then replayed; cut to the run's selection
    ``splits``, id -> split) or computed / resumed / reused from its cache."""
    if cfg["llm"].get("records"):
        from mice_exp.paths import resolve

        from mice_exp.features import make_view

        needs = make_view(cfg["features"]).record_fields
        stage = read_records_file(resolve(cfg["llm"]["records"], paths.root), cfg["dataset"]["name"], needs, splits,
                                  expect=records_expect(cfg))
        stage.replay = lambda: _replayed(cfg, paths, stage)
        return stage
    from mice_exp.llm.stage import run_llm_stage

    return read_stage(run_llm_stage(cfg, paths))


def _replayed(cfg: dict[str, Any], paths: Paths, stage: StageOutput) -> dict[str, np.ndarray]:
    """A records file's hidden states, replayed by its LLM when a view or estimator first reads them."""
    from mice_exp.llm.replay import replay_activations

    return replay_activations(cfg, paths, stage)


def confidence_sources(cfg: dict[str, Any], paths: Paths, stage: StageOutput) -> dict[str, np.ndarray]:
    """p_true / verbalized / consistency / acts for every record: from the records file, or computed
    once and cached beside the LLM stage."""
    names = list(cfg["sources"]["use"])
    if not names:
        return {}
    if stage.folder is None:
        missing = [n for n in names if n not in stage.sources]
        if missing:
            raise UserError(f"sources.use={names}: the records file {cfg['llm']['records']} holds "
                            f"{sorted(stage.sources) or 'no sources'}, not {missing}; expected sources it holds "
                            f"(compute them with `mice-exp records llm.records=FILE sources.use=[...]`)")
        return {n: np.array([np.nan if v is None else v for v in stage.sources[n]], dtype=np.float64) for n in names}
    from mice_exp.llm.sources import stage_sources

    return stage_sources(cfg, paths, stage, names)


def _argument_scores(cfg: dict[str, Any], paths: Paths, records: list[dict[str, Any]]) -> dict[str, float]:
    """Per-argument and API-name confidence on the test calls, labelled against their examples' gold."""
    from mice_exp.features.arguments import argument_metrics
    from mice_exp.data import select_examples
    from mice_exp.llm.toolcall import call_format

    examples = {e.id: e for e in select_examples(cfg["dataset"], paths).examples}
    scores = argument_metrics([r for r in records if r["split"] == "test"], examples, call_format(cfg["prompt"]))
    print("\n" + scores.summary())
    return scores.metrics


def _log_rows(cfg: dict[str, Any], paths: Paths, stage: StageOutput, fs, rows, tracker) -> dict[str, Any]:
    """What a run with Table-1 rows logs: every row's metrics (the reference rows as ``baseline.*``),
    the action-belief and per-argument scores, the field diagnostics, the predictions and figures,
    and the gate of the fitted estimator."""
    metrics = dict(rows[-1].metrics)
    for row in rows[:-1]:
        metrics |= {schema.baseline_key(row.key, k): v for k, v in row.metrics.items()}
    if "acts" in fs.sources:
        from mice_exp.estimation import action_belief

        text, belief = action_belief(rows, fs.sources["acts"][fs.rows("test")], fs.labels[fs.rows("test")])
        print("\n" + text)
        metrics |= belief
    metrics |= _argument_scores(cfg, paths, stage.records)
    if hasattr(rows[-1].estimator, "diagnose"):
        metrics |= _diagnose_field(cfg, rows[-1].estimator, fs, tracker)
    tracker.log_metrics(metrics)
    _log_outputs(tracker, rows, fs, cfg)
    from mice_exp.gate.build import save_run_gate

    saved = save_run_gate(cfg, paths, stage, fs, rows[-1].estimator, tracker)
    if saved:
        where = saved.get("uri") or saved.get("folder")
        print(f"gate saved: {where} (mice-exp gate model={where} input=queries.jsonl; mice-exp serve model={where})")
    return metrics | {"objective": rows[-1].metrics[schema.OBJECTIVE]}


def _estimate(cfg: dict[str, Any], paths: Paths, stage: StageOutput, tracker) -> dict[str, Any]:
    """Feature view -> protocol -> log."""
    from mice_exp.estimation import Study
    from mice_exp.features import build_features
    from mice_exp.protocols import make_protocol

    sources = confidence_sources(cfg, paths, stage)
    fs = build_features(cfg["features"], stage, paths.features, seed=int(cfg["seed"]), sources=sources)
    outcome = make_protocol(cfg["protocol"]).run(Study.from_config(cfg), fs)
    print("\n" + outcome.text)
    if (note := small_test_note(int(fs.rows("test").sum()), cfg["llm"]["name"], paths.root)) is not None:
        print(note)
    for name, frame in outcome.tables.items():
        tracker.log_table(frame, name)
    for name, figure in outcome.figures.items():
        tracker.log_figure(figure, name)
    return _log_rows(cfg, paths, stage, fs, outcome.rows, tracker) if outcome.rows else {}


#: Fewer test calls than this cannot separate the estimators (one call moves a cell by 1/n).
FEW_TEST_CALLS = 100


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


def finished_before(cfg: dict[str, Any], paths: Paths, sweep: str) -> str | None:
    """The id of a FINISHED MLflow run with the same resolved config, so a re-run or resumed sweep skips
    it; the run is tagged as reused by ``sweep``, so the sweep's report still finds it."""
    from mice_exp.tracking.sweeps import mark_reused
    from mice_exp.tracking.store import ensure_experiment, is_enabled, open_client, tracking_uri

    if not is_enabled(cfg["tracking"]):
        return None
    experiment = ensure_experiment(cfg["tracking"], paths.root)
    client = open_client(tracking_uri(cfg["tracking"], paths.root))
    done = finished_run_with_config(client, experiment, config_hash(cfg))
    if done is not None:
        mark_reused(client, done, sweep)
    return done


def job_config(cfg: DictConfig | dict) -> tuple[dict[str, Any], Paths]:
    """The resolved, checked config a job runs with, records and hashes (:func:`config_hash`), and its paths.

    The Slurm launcher calls it too, before submitting, to drop the jobs :func:`finished_before` finds done.
    """
    cfg = as_plain(cfg)
    check_config(cfg)
    keep_used_baselines(cfg)  # params, config hash and saved config: only the estimators this run reads
    if not cfg["llm"].get("records"):  # the dtype auto picks, in the params, the config hash and the gate
        cfg["llm"]["dtype"] = resolve_dtype(cfg["llm"]["dtype"], cfg["llm"]["device"])
    return cfg, paths_from(cfg["paths"])


def run_shard(cfg: dict[str, Any], paths: Paths) -> dict[str, Any]:
    """``llm.shard=i``: worker i's batches of the LLM stage and nothing else (no estimation, no MLflow run),
    as a Slurm array task or a sweep job over ``llm.shard`` runs it; the stage is whole once every worker has."""
    from mice_exp.llm.shards import shard_note
    from mice_exp.llm.stage import run_llm_stage

    out = run_llm_stage(cfg, paths)
    print(shard_note(cfg, paths, out) or f"llm.shard={cfg['llm']['shard']}: the LLM stage is complete in {out}; "
                                         "runs without llm.shard read it")
    return {"llm_cache": str(out), "complete": (out / "done.json").exists()}


def run(cfg: DictConfig | dict) -> dict[str, Any]:
    """Run the configured pipeline and return its metrics (``objective``: the estimator's AUC-ETCU)."""
    from mice_exp.tracking import hydra_tags, tracked_run
    from mice_exp.tracking.dashboard import run_name

    cfg, paths = job_config(cfg)
    check_cache(paths.cache)
    if cfg["llm"].get("shard") is not None:
        return run_shard(cfg, paths)
    tags = {**schema.job_tags(cfg), schema.CONFIG_HASH_TAG: config_hash(cfg), **hydra_tags()}
    in_sweep = schema.SWEEP_TAG in tags  # only sweep jobs skip; a single run always runs
    done = finished_before(cfg, paths, tags[schema.SWEEP_TAG]) if in_sweep and not cfg.get("force") else None
    if done is not None:
        print(f"skipping: MLflow run {done} already FINISHED with this resolved config (force=true re-runs it)")
        return {"run_id": done, "skipped": True}
    with tracked_run(cfg["tracking"], paths.root, run_name=run_name(tags), params=cfg, tags=tags) as tracker:
        selection = check_data(cfg, paths)
        stage = load_stage(cfg, paths, selection.splits)
        print("\n" + llm_summary(cfg["llm"]["display"], stage.records))
        info = stage.info
        result = {"llm_accuracy": info["accuracy"], "llm_examples": info["examples"],
                  "llm_cache": str(stage.folder or cfg["llm"]["records"])}
        tracker.log_metrics({"llm_accuracy": info["accuracy"], "llm_examples": info["examples"],
                             "prompts_with_dropped_demos": info["prompts_with_dropped_demos"]})
        if cfg.get("stage", "all") == "all":
            result |= _estimate(cfg, paths, stage, tracker)
        result["run_id"] = getattr(tracker, "run_id", None)
    return result
