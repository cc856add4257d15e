"""One metric registry (mice_exp.metrics.registry): the run's scores and tests, the console table, the
report's tables, marks and intervals and the MLflow runs table all read it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mice_exp.errors import UserError
from mice_exp.metrics import PAPER_RISKS, Risk, smece
from mice_exp.metrics.registry import METRICS, TABLE1, metric, table_metrics
from mice_exp.paths import PACKAGE_ROOT
from tests.recipes import recipe


def test_table_1_is_the_papers_columns_in_the_papers_order_and_directions():
    assert table_metrics(TABLE1) == ("smece", "etcu_low", "etcu_medium", "etcu_high", "auc_etcu")
    assert [metric(m).header for m in table_metrics(TABLE1)] == [
        "smECE (↓)", "Low risk (↑)", "Medium risk (↑)", "High risk (↑)", "AUC (↑)"]
    assert metric("smece").better(0.01, 0.02) and metric("auc_etcu").better(0.02, 0.01)


def test_a_lower_is_better_metric_is_negated_for_the_permutation_test():
    rng = np.random.default_rng(0)
    p, y = rng.random(50), (rng.random(50) < 0.5).astype(int)
    fn, rows = metric("smece").oriented(PAPER_RISKS)
    assert fn(p, y) == -smece(p, y) and rows(p[None], y[None])[0] == pytest.approx(-smece(p, y))


def test_every_table_metric_scores_many_rows_as_it_scores_one_under_the_run_s_risks():
    """The rows forms a permutation test and the report's bootstrap use, with a run's own medium risk."""
    rng = np.random.default_rng(1)
    p, y = rng.random((20, 60)), (rng.random(60) < 0.5).astype(int)
    risks = {**PAPER_RISKS, "medium": Risk(tp=1.0, fp=-3.0, tn=0.0, fn=0.0)}
    for name in table_metrics(TABLE1):
        fn, rows = metric(name).oriented(risks)
        np.testing.assert_allclose(rows(p, y), [fn(row, y) for row in p], rtol=1e-9, atol=1e-12)


def test_an_unknown_metric_name_is_one_line_naming_the_known_ones():
    from mice_exp.report import tables

    for ask in (lambda: metric("etcu_lowest"), lambda: tables.significance_marks({"etcu_lowest": 0.5}, "etcu_lowest")):
        with pytest.raises(UserError, match="metric 'etcu_lowest' is not a table metric; expected one of "
                                            f"{', '.join(METRICS)}$") as error:
            ask()
        assert "\n" not in str(error.value)


#: What a run, the report and the runs table make of the new Table-1 metric of docs/extending.md, added to the
#: registry (as if to the end of registry.py: ``ENTRY``) before anything reads it.
CHECKS = textwrap.dedent('''
    import numpy as np
    from mice_exp.metrics import PAPER_RISKS, registry

    exec(ENTRY, vars(registry))

    import pandas as pd
    from mice_exp.estimation import Candidate, Study, table
    from mice_exp.metrics import evaluate
    from mice_exp.report import intervals, tables
    from mice_exp.tracking.dashboard import view_state

    rng = np.random.default_rng(0)
    y = (rng.random(200) < 0.5).astype(int)
    p = {"hre": np.full(200, 0.9), "nwkr": np.full(200, 0.8), "mine": np.clip(0.2 + 0.6 * y, 0, 1)}
    study = Study(main=Candidate("mine", "Mine", None), references=[], baselines={}, risks=dict(PAPER_RISKS),
                  permutations=200)
    rows = study.score([(Candidate(key, key.upper(), None), p[key], None) for key in p], y)
    assert evaluate(p["mine"], y, PAPER_RISKS)["mean_p"] == rows[-1].metrics["mean_p"] == np.mean(p["mine"])
    assert rows[-1].marks["mean_p"] == "*†" and rows[-1].metrics["pvalue_mean_p_vs_hre"] < 0.05
    assert "  Mean p" in table(rows, "t").splitlines()[1]
    assert "Mean p (↓)" in tables.to_markdown(pd.DataFrame(columns=tables.COLUMNS), "Confidence Estimator")
    assert "mean_p_p_hre" in tables.COLUMNS and "mean_p" in intervals.TABLE_METRICS
    assert "metrics.`mean_p`" in view_state()["selectedColumns"]
    print("registered")
''')


def test_a_new_table_metric_is_its_function_and_one_registry_entry():
    """Lower is better here: its marks say the run's estimator beats HRE and NWKR by having the lower mean."""
    entry = recipe("A new Table-1 metric")["mice_exp/metrics/registry.py"]
    proc = subprocess.run([sys.executable, "-c", f"ENTRY = {entry!r}\n{CHECKS}"], capture_output=True, text=True,
                          cwd=PACKAGE_ROOT, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "registered", proc.stderr
