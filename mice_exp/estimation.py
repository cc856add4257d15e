"""The estimation stage: fit the configured estimator and its baselines, evaluate them on test.

Every run compares its estimator with the reference rows of MICE Table 1 (raw confidence,
HRE, NWKR), so each run is a self-contained table and permutation tests have partners.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
from hydra.utils import instantiate
from joblib import Parallel, delayed
from omegaconf import OmegaConf

from mice_exp.errors import UserError
from mice_exp.metrics import PAPER_RISKS, Risk, evaluate, permutation_test
from mice_exp.metrics.utility import auc_etcu, etcu
from mice_exp.paths import project_root
from mice_exp.protocols import get_protocol
from mice_exp.tracking.schema import MARKS, TABLE_METRICS, action_belief_key, agent_key, pvalue_key

if TYPE_CHECKING:  # the feature views read the LLM stage's cache; estimation only needs the type
    from mice_exp.features import FeatureSet


@dataclass
class Row:
    key: str
    name: str
    estimator: Any  # fitted (holdout) or None (protocols without a single model)
    p: np.ndarray
    metrics: dict[str, float]
    marks: dict[str, str] = field(default_factory=dict)


def estimator_config(name: str, seed: int) -> dict[str, Any]:
    """A ``conf/estimator`` entry by name (for the baseline rows)."""
    path = project_root() / "conf" / "estimator" / f"{name}.yaml"
    if not path.exists():
        raise UserError(f"no estimator {name!r} (in compare_with or estimator.base); expected a file conf/estimator/{name}.yaml")
    return OmegaConf.to_container(OmegaConf.merge({"seed": seed}, OmegaConf.load(path)), resolve=True)


def build_estimator(entry: Mapping[str, Any], seed: int) -> Any:
    """An unfitted estimator from a ``conf/estimator`` entry; one with a ``base`` (the field
    correction) gets that entry's estimator as its ``base``."""
    if entry.get("base"):
        return instantiate(entry["model"], base=build_estimator(estimator_config(entry["base"], seed), seed))
    return instantiate(entry["model"])


def risks_from(cfg_risk: Mapping[str, Any]) -> dict[str, Risk]:
    """The three paper settings plus the configured one (under its own name)."""
    risks = dict(PAPER_RISKS)
    try:
        risks[cfg_risk["name"]] = Risk(*(float(cfg_risk[k]) for k in ("tp", "fp", "tn", "fn")))
    except ValueError as error:
        raise UserError(f"risk={dict(cfg_risk)}: {error}") from None
    return risks


def _metric_fn(name: str, risks: Mapping[str, Risk]):
    from mice_exp.metrics import smece

    if name == "smece":
        return lambda p, y: -smece(p, y)  # lower is better: compare negated
    if name == "auc_etcu":
        return auc_etcu
    return lambda p, y: etcu(p, y, risks[name.removeprefix("etcu_")])


def run_estimators(cfg: Mapping[str, Any], fs: FeatureSet) -> list[Row]:
    """Fit the estimator under the configured protocol and the reference rows (``compare_with``) under
    holdout; metrics on test, permutation marks vs HRE / NWKR.

    The reference rows are always the in-domain ones Table 1 displays, so a zero-shot (loao) row's
    marks compare it with the very HRE / NWKR predictions shown above it, on the same test calls.
    """
    risks = risks_from(cfg["risk"])
    protocol = get_protocol(cfg["protocol"]["name"])
    reference = get_protocol("holdout")
    y = fs.labels[fs.rows("test")]
    if len(y) == 0:
        raise UserError("the test split is empty; expected dataset.split.test > 0")
    entries = [(k, estimator_config(k, cfg["seed"])) for k in cfg["compare_with"]]
    entries.append((cfg["estimator"]["key"], cfg["estimator"]))
    rows = []
    for n, (key, entry) in enumerate(entries):
        fit = protocol if n == len(entries) - 1 else reference
        p, fitted = fit(build_estimator(entry, cfg["seed"]), fs, entry.get("source", "raw"))
        rows.append(Row(key, entry["name"], fitted, p, evaluate(p, y, risks)))
    by_key = {r.key: r for r in rows}
    main = rows[-1]
    tested = int(cfg["permutations"]) > 0  # 0: no significance tests (sweeps that only need the metrics)
    pairs = [(ref, metric) for ref in MARKS if tested and ref in by_key and ref != main.key for metric in TABLE_METRICS]
    # smECE's bandwidth search makes each permuted metric ~40 ms: run the tests on every core.
    tests = Parallel(n_jobs=int(cfg.get("n_jobs", -1)))(
        delayed(permutation_test)(_metric_fn(metric, risks), main.p, by_key[ref].p, y,
                                  n_permutations=int(cfg["permutations"]), seed=int(cfg["seed"]))
        for ref, metric in pairs)
    for (ref, metric), test in zip(pairs, tests):
        main.metrics[pvalue_key(metric, ref)] = test.p_value
        if test.p_value < 0.05 and test.difference > 0:
            main.marks[metric] = main.marks.get(metric, "") + MARKS[ref]
    return rows


def feature_weights(row: Row, columns: list[str]) -> tuple[np.ndarray, str] | None:
    """Random-forest importances or logistic-regression coefficients (MICE Figures 5, 6)."""
    model = getattr(row.estimator, "model_", None)
    if getattr(row.estimator, "input_kind", None) != "features" or model is None:
        return None
    if hasattr(model, "feature_importances_"):
        return model.feature_importances_, "importance"
    return model.coef_[0], "coefficient"


def table(rows: list[Row], title: str) -> str:
    """Console table in the layout of MICE Table 1."""
    head = f"{'Confidence estimator':<28}{'smECE':>9}{'Low':>9}{'Medium':>9}{'High':>9}{'AUC':>9}"
    lines = [title, head, "-" * len(head)]
    for row in rows:
        cells = "".join(f"{row.metrics[m]:>8.3f}{row.marks.get(m, ' '):<1}" for m in TABLE_METRICS)
        lines.append(f"{row.name:<28}{cells}")
    lines.append("smECE lower is better; tool-calling utility (Low/Medium/High risk, AUC) higher is better. "
                 "* / † : significantly better than HRE / NWKR (permutation test, p < 0.05).")
    return "\n".join(lines)


def action_belief(rows: list[Row], acted: np.ndarray, y: np.ndarray) -> tuple[str, dict[str, float]]:
    """Does the agent act on each confidence? Spearman consistency, agreement with each estimator's
    MBR decision at the three paper risks, and the utility of the agent's own choices (Pal et al.)."""
    from mice_exp.metrics.action_belief import action_belief_consistency, decision_agreement

    metrics = {agent_key(f"etcu_{name}"): etcu(acted.astype(float), y, risk) for name, risk in PAPER_RISKS.items()}
    metrics[agent_key("act_rate")] = float(acted.mean())
    head = f"{'Confidence':<28}{'Spearman':>10}{'agree L':>9}{'agree M':>9}{'agree H':>9}"
    lines = [f"Action-belief consistency (agent acts on {acted.mean():.0%} of test calls; its own utility "
             + " / ".join(f"{metrics[agent_key(f'etcu_{n}')]:.3f}" for n in PAPER_RISKS) + " at low / medium / high)",
             head, "-" * len(head)]
    for row in rows:
        rho = action_belief_consistency(row.p, acted)
        agree = {name: decision_agreement(row.p, acted, risk) for name, risk in PAPER_RISKS.items()}
        metrics |= {action_belief_key(row.key, "spearman"): rho}
        metrics |= {action_belief_key(row.key, f"agree_{n}"): v for n, v in agree.items()}
        lines.append(f"{row.name:<28}{rho:>10.3f}" + "".join(f"{agree[n]:>9.3f}" for n in PAPER_RISKS))
    return "\n".join(lines), metrics
