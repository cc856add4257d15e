"""The results schema: the names a job writes to MLflow and the report reads back.

Jobs (:mod:`mice_exp.run`, :mod:`mice_exp.estimation`, the sweep bookkeeping) and the report
(:mod:`mice_exp.report`) both import these names instead of spelling them, so renaming a metric,
artifact or tag breaks an import instead of silently emptying a report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mice_exp.cache import stable_hash

# --------------------------------------------------------------------------- metrics

# A run's own metrics are named by mice_exp.metrics (the tables' columns: mice_exp.metrics.registry).
#: Reference rows every run tests its estimator against, and the mark of a significant win (Table 1).
MARKS = {"hre": "*", "nwkr": "†"}
#: The run's optimised metric; present only in runs that reached the estimation stage.
OBJECTIVE = "auc_etcu"

BASELINE = "baseline"
FIELD = "field"
ACTION_BELIEF = "action_belief"
AGENT = "agent"
TRAJECTORY = "trajectory"


def baseline_key(estimator: str, metric: str) -> str:
    """A reference row's metric, logged beside the run's own: ``baseline.<estimator>.<metric>``."""
    return f"{BASELINE}.{estimator}.{metric}"


def parse_baseline_key(name: str) -> tuple[str, str] | None:
    """(estimator, metric) of a :func:`baseline_key`, or None for any other metric name."""
    return _per_estimator(BASELINE, name)


def pvalue_key(metric: str, reference: str) -> str:
    """The permutation test's p-value of the run's ``metric`` against reference row ``reference``."""
    return f"pvalue_{metric}_vs_{reference}"


def field_key(name: str) -> str:
    """A miscalibration-field diagnostic (``field.frac_over``, ``field.worst_slice_gap``, ``field.alpha``...)."""
    return f"{FIELD}.{name}"


def action_belief_key(estimator: str, statistic: str) -> str:
    """The agent's consistency with one confidence: ``action_belief.<estimator>.<spearman|agree_<risk>>``."""
    return f"{ACTION_BELIEF}.{estimator}.{statistic}"


def parse_action_belief_key(name: str) -> tuple[str, str] | None:
    """(estimator, statistic) of an :func:`action_belief_key`, or None."""
    return _per_estimator(ACTION_BELIEF, name)


def trajectory_key(estimator: str, statistic: str) -> str:
    """A multi-turn run's conversation-level score of one confidence: ``trajectory.<estimator>.<product_brier|
    min_auroc|...>`` (:mod:`mice_exp.metrics.trajectory`); ``trajectory.n`` and ``trajectory.right_rate`` once."""
    return f"{TRAJECTORY}.{estimator}.{statistic}" if estimator else f"{TRAJECTORY}.{statistic}"


def parse_trajectory_key(name: str) -> tuple[str, str] | None:
    """(estimator, statistic) of a per-estimator :func:`trajectory_key`, or None."""
    return _per_estimator(TRAJECTORY, name)


def _per_estimator(prefix: str, name: str) -> tuple[str, str] | None:
    """(estimator, rest) of a ``<prefix>.<estimator>.<rest>`` metric name, or None."""
    head, _, tail = name.partition(".")
    estimator, _, rest = tail.partition(".")
    return (estimator, rest) if head == prefix and estimator and rest else None


#: Per-span confidence (:mod:`mice_exp.features.arguments`): a call's top-level argument values and its API name,
#: each scored by the token-probability product, the logit-lens layers' agreement on the span, the least likely
#: token's probability and the tokens' geometric mean (the product without its length).
ARGUMENT = "argument"
API_NAME = "api_name"
PRODUCT = "product"
LENS = "lens"
MIN_TOKEN = "min_token"
MEAN_TOKEN = "mean_token"
SPAN_CONFIDENCES = (PRODUCT, LENS, MIN_TOKEN, MEAN_TOKEN)


def span_key(span: str, statistic: str, confidence: str = PRODUCT) -> str:
    """``argument.auroc`` (token product, the first logged), ``argument.lens_auroc``, ``api_name.n``..."""
    return f"{span}.{'' if confidence == PRODUCT else confidence + '_'}{statistic}"


def agent_key(statistic: str) -> str:
    """What the agent itself did (``agent.act_rate``, ``agent.etcu_<risk>``)."""
    return f"{AGENT}.{statistic}"


# --------------------------------------------------------------------------- artifacts

#: Test predictions: columns ``id``, ``api``, ``label`` and one :func:`prediction_column` per row.
PREDICTIONS = "predictions.csv"
SAMPLE_EFFICIENCY_CSV = "sample_efficiency.csv"
#: Every (estimator, size, trial, group) fit behind the sample-efficiency table: its test AUC-ETCU.
SAMPLE_EFFICIENCY_FITS_CSV = "sample_efficiency_fits.csv"
RELIABILITY_FIGURE = "figures/reliability.png"
ETCU_FIGURE = "figures/etcu_curve.png"
RISK_COVERAGE_FIGURE = "figures/risk_coverage.png"
FEATURE_WEIGHTS_FIGURE = "figures/feature_weights.png"
LAYER_SCORES_FIGURE = "figures/bertscore_by_layer.png"
SAMPLE_EFFICIENCY_FIGURE = "figures/sample_efficiency.png"
#: The gate's folder among a run's artifacts (``runs:/<run id>/gate``).
GATE_ARTIFACT = "gate"


def prediction_column(estimator: str) -> str:
    """The column of :data:`PREDICTIONS` holding ``estimator``'s test confidences."""
    return f"p_{estimator}"


def field_region_figure(region: str) -> str:
    """The reliability diagram of the base confidence inside one miscalibration region."""
    return f"figures/{FIELD}/reliability_{region}.png"


# --------------------------------------------------------------------------- tags

#: Tags of a job run that together identify a table cell's source, and the config value behind each
#: (a run that lacks a tag is read from its params).
KEY_TAGS = {"llm": "llm.name", "dataset": "dataset.name", "features": "features.name",
            "estimator": "estimator.key", "protocol": "protocol.name"}
RISK_TAG = "risk"
#: Which calls of the data set a job ran on (:func:`selection`): runs on 45 and on 750 STE calls differ in name
#: and sit in separate groups of the runs table.
SELECTION_TAG = "selection"
#: The dataset settings that cut a data set down, in the order :func:`selection` names them.
SELECTION_KEYS = ("apis", "max_apis", "max_per_api", "max_conversations")
#: A digest of the job's resolved config: a re-run sweep skips jobs whose config already FINISHED.
CONFIG_HASH_TAG = "config_hash"
#: The sweep a job belongs to (``hydra.sweep.dir``), its parent run, the sweep's overrides, a report run.
SWEEP_TAG = "sweep"
PARENT_TAG = "sweep_parent"
OVERRIDES_TAG = "sweep.overrides"
REPORT_TAG = "report"


def reused_tag(sweep: str) -> str:
    """The tag a FINISHED run gets when a job of ``sweep`` skipped itself because of it."""
    return f"{SWEEP_TAG}.reused.{stable_hash(sweep, length=16)}"


def selection(dataset: Mapping[str, Any]) -> str:
    """``all``, or the dataset settings that cut the data set (``max_apis=3``, ``apis=[live_simple]``): what sets a
    run's test-set size, and so how much its table can say (12 test calls cannot separate the estimators)."""
    cuts = []
    for key in SELECTION_KEYS:
        value = dataset.get(key)
        if value is not None:
            shown = f"[{','.join(map(str, value))}]" if isinstance(value, (list, tuple)) else value
            cuts.append(f"{key}={shown}")
    return ",".join(cuts) or "all"


def job_tags(cfg: dict) -> dict[str, str]:
    """The identifying tags of a job run with resolved config ``cfg`` (plus the risk setting and the selection)."""
    paths = {**KEY_TAGS, RISK_TAG: "risk.name"}
    tags = {tag: cfg[group][key] for tag, (group, key) in ((tag, path.split(".")) for tag, path in paths.items())}
    return tags | {SELECTION_TAG: selection(cfg["dataset"])}
