"""The estimation stage's objects: the estimators a protocol fits and how its rows are scored.

Every run compares its estimator with the reference rows of MICE Table 1 (raw confidence,
HRE, NWKR), so each run is a self-contained table and permutation tests have partners. Every
estimator comes from the composed config: the run's own from ``estimator``, the others from
``baselines.<key>`` (``conf/config.yaml`` composes every ``conf/estimator`` entry there), so a
command-line override such as ``baselines.hre.model.n_bins=20`` reaches the HRE row. The
protocols (:mod:`mice_exp.protocols`) decide which rows train and predict each estimator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from joblib import Parallel, delayed

from mice_exp.errors import UserError
from mice_exp.metrics import ALPHA, PAPER_RISKS, Risk, evaluate, permutation_test, smece, smece_rows
from mice_exp.metrics.permutation import Metric, RowsMetric
from mice_exp.metrics.utility import auc_etcu, etcu
from mice_exp.tracking.schema import MARKS, TABLE_METRICS, action_belief_key, agent_key, pvalue_key


@dataclass
class Row:
    key: str
    name: str
    estimator: Any  # fitted (holdout) or None (protocols without a single model)
    p: np.ndarray
    metrics: dict[str, float]
    marks: dict[str, str] = field(default_factory=dict)


@dataclass
class Candidate:
    """An unfitted estimator with what a table calls it (``key`` in metric names, ``name`` on screen)
    and the confidence source it reads when it calibrates one confidence (``estimator.source``)."""

    key: str
    name: str
    estimator: Any
    source: str = "raw"


def baseline_entry(baselines: Mapping[str, Any] | None, key: str, where: str) -> Mapping[str, Any]:
    """The composed ``baselines.<key>`` entry that ``where`` (compare_with, estimator.base, ...) names."""
    baselines = baselines or {}
    if key not in baselines:
        raise UserError(f"{where} names {key!r}, which is not a composed estimator; expected one of "
                        f"{', '.join(baselines) or 'the conf/estimator entries'} (an estimator file of your own: "
                        f"add +estimator@baselines.{key}={key})")
    return baselines[key]


def build_estimator(entry: Mapping[str, Any], baselines: Mapping[str, Any] | None = None) -> Any:
    """An unfitted estimator from a composed ``conf/estimator`` entry; one with a ``base`` (the field
    correction) gets ``baselines.<base>``'s estimator as its ``base``."""
    try:
        if entry.get("base"):
            base = baseline_entry(baselines, entry["base"], "estimator.base")
            return instantiate(entry["model"], base=build_estimator(base, baselines))
        return instantiate(entry["model"])
    except InstantiationException as error:
        reason = " ".join(str(error).replace(", set env var HYDRA_FULL_ERROR=1 to see chained exception", "").split())
        raise UserError(f"estimator {entry.get('key')!r}: {reason}") from None


def candidate(entry: Mapping[str, Any], baselines: Mapping[str, Any] | None = None) -> Candidate:
    """A composed ``conf/estimator`` entry as an unfitted :class:`Candidate`."""
    return Candidate(entry["key"], entry["name"], build_estimator(entry, baselines), entry.get("source", "raw"))


def risks_from(cfg_risk: Mapping[str, Any]) -> dict[str, Risk]:
    """The three paper settings plus the configured one (under its own name)."""
    risks = dict(PAPER_RISKS)
    try:
        risks[cfg_risk["name"]] = Risk(*(float(cfg_risk[k]) for k in ("tp", "fp", "tn", "fn")))
    except ValueError as error:
        raise UserError(f"risk={dict(cfg_risk)}: {error}") from None
    return risks


def _metric_fns(name: str, risks: Mapping[str, Risk]) -> tuple[Metric, RowsMetric | None]:
    """A table metric as permutation_test compares it (higher is better), and its rows form if it has one."""
    if name == "smece":  # lower is better: compare negated
        return (lambda p, y: -smece(p, y)), (lambda p, y: -smece_rows(p, y))
    if name == "auc_etcu":
        return auc_etcu, None
    return (lambda p, y: etcu(p, y, risks[name.removeprefix("etcu_")])), None


@dataclass
class Study:
    """What a protocol fits and how its rows are scored: the run's estimator (``main``), the reference
    rows (``compare_with``), every composed estimator entry (``baselines``: protocols that choose
    their own estimators, such as sample efficiency, build them from here), the risks and the
    permutation tests' settings; ``llm``, ``dataset`` and ``features`` only label tables and figures."""

    main: Candidate
    references: list[Candidate]
    baselines: Mapping[str, Mapping[str, Any]]
    risks: dict[str, Risk]
    permutations: int = 1000
    seed: int = 0
    n_jobs: int = 1
    llm: str = ""
    dataset: str = ""
    features: str = ""

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Study:
        """The study a resolved run config describes (every name checked: one-line errors)."""
        baselines = cfg.get("baselines") or {}
        references = [candidate(baseline_entry(baselines, key, "compare_with"), baselines) for key in cfg["compare_with"]]
        return cls(main=candidate(cfg["estimator"], baselines), references=references, baselines=baselines,
                   risks=risks_from(cfg["risk"]), permutations=int(cfg["permutations"]), seed=int(cfg["seed"]),
                   n_jobs=int(cfg.get("n_jobs", 1)), llm=cfg["llm"]["display"], dataset=cfg["dataset"]["name"],
                   features=cfg["features"]["name"])

    def candidate(self, key: str, where: str) -> Candidate:
        """A fresh unfitted estimator of ``baselines.<key>`` (``where``: the setting that names it)."""
        return candidate(baseline_entry(self.baselines, key, where), self.baselines)

    def heading(self, protocol: str, n_test: int) -> str:
        return f"{self.llm} on {self.dataset} ({protocol}, features {self.features}, {n_test} test examples)"

    def _test(self, metric: str, p_main: np.ndarray, p_ref: np.ndarray, y: np.ndarray) -> Any:
        """The delayed permutation test of ``metric`` between the run's estimator and a reference row."""
        fn, rows_fn = _metric_fns(metric, self.risks)
        return delayed(permutation_test)(fn, p_main, p_ref, y, n_permutations=self.permutations, seed=self.seed,
                                         alpha=ALPHA, rows_metric=rows_fn)

    def score(self, fitted: Sequence[tuple[Candidate, np.ndarray, Any]], y: np.ndarray) -> list[Row]:
        """Rows of ``(candidate, test predictions, fitted estimator or None)``, the run's estimator last:
        metrics on the test labels ``y``, the last row's p-values and marks against HRE / NWKR."""
        rows = [Row(c.key, c.name, model, p, evaluate(p, y, self.risks)) for c, p, model in fitted]
        by_key = {r.key: r for r in rows}
        main = rows[-1]
        tested = self.permutations > 0  # 0: no significance tests (sweeps that only need the metrics)
        pairs = [(ref, metric) for ref in MARKS if tested and ref in by_key and ref != main.key for metric in TABLE_METRICS]
        tests = Parallel(n_jobs=self.n_jobs)(self._test(metric, main.p, by_key[ref].p, y) for ref, metric in pairs)
        for (ref, metric), test in zip(pairs, tests):
            main.metrics[pvalue_key(metric, ref)] = test.p_value
            if test.p_value < ALPHA and test.difference > 0:
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
                 f"* / † : significantly better than HRE / NWKR (permutation test, p < {ALPHA}).")
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
