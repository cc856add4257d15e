"""The metrics the results tables show, in one registry: name, direction, header and function.

A run scores its rows and tests them against the reference rows (:mod:`mice_exp.estimation`), the report
ranks, marks and bootstraps its cells (:mod:`mice_exp.report`) and the MLflow runs table orders its columns
(:mod:`mice_exp.tracking.dashboard`) from :data:`METRICS`, each when it is imported: a new table metric is
its function and one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from mice_exp.errors import UserError
from mice_exp.metrics.calibration import smece
from mice_exp.metrics.permutation import Metric, RowsMetric
from mice_exp.metrics.selective import aurc, prr
from mice_exp.metrics.smooth_ece import smece_rows
from mice_exp.metrics.utility import PAPER_RISKS, Risk, auc_etcu, auc_etcu_rows, etcu, etcu_rows

#: f(p, y, risks): a metric of confidences p against labels y; ``risks`` are the run's settings by name.
Score = Callable[[np.ndarray, np.ndarray, Mapping[str, Risk]], float]
#: The same over the rows of a (resamples x examples) matrix p, one value per row.
RowsScore = Callable[[np.ndarray, np.ndarray, Mapping[str, Risk]], np.ndarray]
#: The tables a metric can be a column of: MICE Table 1 (and Table 2, its ablation), and selective prediction.
TABLE1, SELECTIVE = "table1", "selective"


@dataclass(frozen=True)
class TableMetric:
    """A column of the results tables: ``label`` heads it (``short`` in the console), ``higher_is_better``
    ranks and marks it, ``score`` computes it, ``rows`` over many resamples at once where that is faster
    (:func:`~mice_exp.metrics.permutation.permutation_test`), ``tables`` says which tables show it."""

    name: str
    label: str
    higher_is_better: bool
    score: Score
    tables: tuple[str, ...]
    rows: RowsScore | None = None
    short: str | None = None

    @property
    def console(self) -> str:
        """The column's name in the console table."""
        return self.short or self.label

    @property
    def header(self) -> str:
        """The column header of the Markdown tables, its direction as an arrow."""
        return f"{self.label} ({'↑' if self.higher_is_better else '↓'})"

    def better(self, value: float, reference: float) -> bool:
        return value > reference if self.higher_is_better else value < reference

    def at(self, risks: Mapping[str, Risk]) -> Metric:
        """f(p, y) under the risk settings ``risks``."""
        return lambda p, y: self.score(p, y, risks)

    def rows_at(self, risks: Mapping[str, Risk]) -> RowsMetric | None:
        """f(p, y) over the rows of p under the risk settings ``risks`` (None: the metric has no rows form)."""
        rows = self.rows
        return None if rows is None else lambda p, y: rows(p, y, risks)

    def oriented(self, risks: Mapping[str, Risk]) -> tuple[Metric, RowsMetric | None]:
        """The metric and its rows form as a permutation test compares them: higher is better (negated if lower is)."""
        rows = self.rows_at(risks)
        if self.higher_is_better:
            return self.at(risks), rows
        return (lambda p, y: -self.score(p, y, risks)), (None if rows is None else lambda p, y: -rows(p, y))


def _utility_at(risk: str) -> Score:
    return lambda p, y, risks: etcu(p, y, risks[risk])


def _utility_rows_at(risk: str) -> RowsScore:
    return lambda p, y, risks: etcu_rows(p, y, risks[risk])


METRICS: dict[str, TableMetric] = {m.name: m for m in (
    TableMetric("smece", "smECE", False, lambda p, y, risks: smece(p, y), (TABLE1, SELECTIVE),
                rows=lambda p, y, risks: smece_rows(p, y)),
    *(TableMetric(f"etcu_{risk}", f"{risk.capitalize()} risk", True, _utility_at(risk), (TABLE1,),
                  rows=_utility_rows_at(risk), short=risk.capitalize()) for risk in PAPER_RISKS),
    TableMetric("auc_etcu", "AUC", True, lambda p, y, risks: auc_etcu(p, y), (TABLE1, SELECTIVE),
                rows=lambda p, y, risks: auc_etcu_rows(p, y)),
    TableMetric("prr", "PRR", True, lambda p, y, risks: prr(p, y), (SELECTIVE,)),
    TableMetric("aurc", "AURC", False, lambda p, y, risks: aurc(p, y), (SELECTIVE,)),
)}


def metric(name: str) -> TableMetric:
    """The registry's entry for ``name``; an unknown name is one line naming the known ones."""
    if name not in METRICS:
        raise UserError(f"metric {name!r} is not a table metric; expected one of {', '.join(METRICS)}")
    return METRICS[name]


def table_metrics(table: str) -> tuple[str, ...]:
    """The names of the metrics ``table`` (:data:`TABLE1`, :data:`SELECTIVE`) shows, in registry order."""
    return tuple(name for name, m in METRICS.items() if table in m.tables)
