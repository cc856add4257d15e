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
from mice_exp.llm.settings import LLMSettings
from mice_exp.metrics import ALPHA, MAX_PERMUTATIONS, PAPER_RISKS, Risk, etcu, evaluate, permutation_test
from mice_exp.metrics.registry import METRICS, TABLE1, metric, table_metrics
from mice_exp.needs import RAW, Needs
from mice_exp.tracking.schema import MARKS, action_belief_key, agent_key, pvalue_key, trajectory_key

#: The console table's columns (MICE Table 1's).
TABLE_METRICS = table_metrics(TABLE1)


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
    source: str = RAW

    @property
    def needs(self) -> Needs:
        """What the estimator reads beyond the feature view, with the source it calibrates."""
        return self.estimator.needs(self.source)


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
    return Candidate(entry["key"], entry["name"], build_estimator(entry, baselines), entry.get("source", RAW))


def risks_from(cfg_risk: Mapping[str, Any]) -> dict[str, Risk]:
    """The three paper settings plus the configured one (under its own name)."""
    risks = dict(PAPER_RISKS)
    try:
        risks[cfg_risk["name"]] = Risk(*(float(cfg_risk[k]) for k in ("tp", "fp", "tn", "fn")))
    except ValueError as error:
        raise UserError(f"risk={dict(cfg_risk)}: {error}") from None
    return risks


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
    risk: str = "medium"  # the configured risk's name among ``risks`` (what a gate decides with)
    named: dict[str, Candidate] = field(default_factory=dict)  # the protocol's own estimators, by key
    diagnostics: Mapping[str, Any] = field(default_factory=dict)  # estimator.diagnostics: the field's regions
    permutations: int = MAX_PERMUTATIONS  # the most draws a test makes before it leaves its mark undecided
    seed: int = 0
    n_jobs: int = 1
    llm: str = ""
    dataset: str = ""
    features: str = ""

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], named: Sequence[str] = ()) -> Study:
        """The study a resolved run config describes, each estimator built once: the run's, the reference rows
        and the ``named`` keys a protocol fits (``protocol.estimators``); every name checked: one-line errors."""
        baselines = cfg.get("baselines") or {}
        references = [candidate(baseline_entry(baselines, key, "compare_with"), baselines) for key in cfg["compare_with"]]
        own = {key: candidate(baseline_entry(baselines, key, "protocol.estimators"), baselines) for key in named}
        return cls(main=candidate(cfg["estimator"], baselines), references=references, baselines=baselines,
                   risks=risks_from(cfg["risk"]), risk=str(cfg["risk"]["name"]), named=own,
                   diagnostics=cfg["estimator"].get("diagnostics") or {},
                   permutations=int(cfg["permutations"]), seed=int(cfg["seed"]),
                   n_jobs=int(cfg.get("n_jobs", 1)), llm=LLMSettings.from_config(cfg["llm"]).display,
                   dataset=cfg["dataset"]["name"], features=cfg["features"]["name"])

    def candidate(self, key: str, where: str) -> Candidate:
        """The unfitted estimator of ``baselines.<key>`` (``where``: the setting that names it): the one built with
        the study when it was ``named``, else built now (a protocol made apart from the study, as in tests)."""
        return self.named.get(key) or candidate(baseline_entry(self.baselines, key, where), self.baselines)

    def heading(self, protocol: str, n_test: int) -> str:
        return f"{self.llm} on {self.dataset} ({protocol}, features {self.features}, {n_test} test examples)"

    def _test(self, name: str, p_main: np.ndarray, p_ref: np.ndarray, y: np.ndarray) -> Any:
        """The delayed permutation test of metric ``name`` between the run's estimator and a reference row."""
        fn, rows_fn = metric(name).oriented(self.risks)
        return delayed(permutation_test)(fn, p_main, p_ref, y, seed=self.seed, alpha=ALPHA,
                                         max_permutations=self.permutations, rows_metric=rows_fn)

    def score(self, fitted: Sequence[tuple[Candidate, np.ndarray, Any]], y: np.ndarray) -> list[Row]:
        """Rows of ``(candidate, test predictions, fitted estimator or None)``, the run's estimator last:
        metrics on the test labels ``y``, the last row's p-values and marks against HRE / NWKR."""
        rows = [Row(c.key, c.name, model, p, evaluate(p, y, self.risks)) for c, p, model in fitted]
        by_key = {r.key: r for r in rows}
        main = rows[-1]
        tested = self.permutations > 0  # 0: no significance tests (sweeps that only need the metrics)
        pairs = [(ref, m) for ref in MARKS if tested and ref in by_key and ref != main.key for m in TABLE_METRICS]
        tests = Parallel(n_jobs=self.n_jobs)(self._test(m, main.p, by_key[ref].p, y) for ref, m in pairs)
        for (ref, m), test in zip(pairs, tests):
            main.metrics[pvalue_key(m, ref)] = test.p_value
            if test.p_value < ALPHA and test.difference > 0:
                main.marks[m] = main.marks.get(m, "") + MARKS[ref]
        return rows


def feature_weights(row: Row, columns: list[str]) -> tuple[np.ndarray, str] | None:
    """Random-forest importances or logistic-regression coefficients (MICE Figures 5, 6) of an estimator whose X
    is the feature view's ``columns``."""
    model = getattr(row.estimator, "model_", None)
    if model is None or row.estimator.input_columns(columns) != list(columns):
        return None
    if hasattr(model, "feature_importances_"):
        return model.feature_importances_, "importance"
    return model.coef_[0], "coefficient"


def shown(rows: list[Row]) -> list[Row]:
    """The rows a console table prints: a reference row that is the run's own estimator with the same predictions
    (``estimator=raw``; the run's row is the last) once, as the run's row. Under leave-one-API-out the two differ
    (``estimator=hre protocol=loao``: holdout and zero-shot HRE), and both are printed."""
    if not rows:
        return rows
    main = rows[-1]
    return [row for row in rows[:-1] if row.key != main.key or not np.array_equal(row.p, main.p)] + rows[-1:]


def table(rows: list[Row], title: str) -> str:
    """Console table in the layout of MICE Table 1."""
    columns = [METRICS[m] for m in TABLE_METRICS]
    head = f"{'Confidence estimator':<28}" + "".join(f"{m.console:>9}" for m in columns)
    lines = [title, head, "-" * len(head)]
    for row in shown(rows):
        cells = "".join(f"{row.metrics[m.name]:>8.3f}{row.marks.get(m.name, ' '):<1}" for m in columns)
        lines.append(f"{row.name:<28}{cells}")
    lower = ", ".join(m.console for m in columns if not m.higher_is_better)
    higher = ", ".join(m.console for m in columns if m.higher_is_better)
    lines.append(f"{lower} lower is better; {higher} higher is better. "
                 f"* / † : significantly better than HRE / NWKR (permutation test, p < {ALPHA}).")
    return "\n".join(lines)


def action_belief(rows: list[Row], acted: np.ndarray, y: np.ndarray) -> tuple[str, dict[str, float]]:
    """Does the agent act on each confidence? Spearman consistency, agreement with each estimator's
    MBR decision at the three paper risks, and the utility of the agent's own choices (Pal et al.)."""
    from mice_exp.metrics.action_belief import action_belief_consistency, decision_agreement  # loads scipy

    metrics = {agent_key(f"etcu_{name}"): etcu(acted.astype(float), y, risk) for name, risk in PAPER_RISKS.items()}
    metrics[agent_key("act_rate")] = float(acted.mean())
    head = f"{'Confidence':<28}{'Spearman':>10}{'agree L':>9}{'agree M':>9}{'agree H':>9}"
    lines = [f"Action-belief consistency (agent acts on {acted.mean():.0%} of test calls; its own utility "
             + " / ".join(f"{metrics[agent_key(f'etcu_{n}')]:.3f}" for n in PAPER_RISKS) + " at low / medium / high)",
             head, "-" * len(head)]
    for row in shown(rows):
        rho = action_belief_consistency(row.p, acted)
        agree = {name: decision_agreement(row.p, acted, risk) for name, risk in PAPER_RISKS.items()}
        metrics |= {action_belief_key(row.key, "spearman"): rho}
        metrics |= {action_belief_key(row.key, f"agree_{n}"): v for n, v in agree.items()}
        lines.append(f"{row.name:<28}{rho:>10.3f}" + "".join(f"{agree[n]:>9.3f}" for n in PAPER_RISKS))
    return "\n".join(lines), metrics


def trajectory(rows: list[Row], conversations: Sequence[str], y: np.ndarray) -> tuple[str, dict[str, float]]:
    """Each row's confidence of whole conversations (the product and the minimum of their test steps'
    probabilities) against whether every step was right: Brier, log loss, smECE, AUROC
    (:mod:`mice_exp.metrics.trajectory`)."""
    from mice_exp.metrics.trajectory import trajectories, trajectory_scores  # loads pandas

    metrics: dict[str, float] = {}
    head = f"{'Confidence':<28}" + "".join(f"{c:>11}" for c in ("prod Brier", "prod logL", "prod AUROC",
                                                                 "min Brier", "min logL", "min AUROC"))
    lines = []
    for row in shown(rows):
        scores = trajectory_scores(trajectories(conversations, row.p, y))
        metrics |= {trajectory_key("", k): scores[k] for k in ("n", "right_rate")}
        metrics |= {trajectory_key(row.key, k): v for k, v in scores.items() if k not in ("n", "right_rate")}
        lines.append(f"{row.name:<28}" + "".join(f"{scores[f'{a}_{m}']:>11.3f}" for a in ("product", "min")
                                                  for m in ("brier", "log_loss", "auroc")))
    n, rate = int(metrics[trajectory_key("", "n")]), metrics[trajectory_key("", "right_rate")]
    title = f"Trajectories: {n} test conversations, {rate:.0%} right at every step"
    return "\n".join([title, head, "-" * len(head), *lines]), metrics
