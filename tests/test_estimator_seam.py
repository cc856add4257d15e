"""The estimator seam (issue 58): a new estimator is its module and its YAML, and nothing outside the estimators
asks which kind of input an estimator reads (each declares it, ``reads``)."""

from __future__ import annotations

import ast
import sys

import pytest
from mlflow import MlflowClient
from sklearn.utils.estimator_checks import check_estimator

import mice_exp.estimators
from conftest import tiny_run
from mice_exp.estimators import estimator_classes
from mice_exp.paths import PACKAGE_ROOT
from tests.conftest import package_findings
from test_sklearn_checks import expected_failed_checks, small

FIXTURE = PACKAGE_ROOT / "tests" / "fixtures" / "ste_tiny.json"

#: An estimator of one's own: the raw confidence pulled halfway towards the training base rate. It declares what it
#: reads (one confidence) and implements ``_fit`` and ``_predict``; the base class does the rest.
SHRUNK_MODULE = '''
"""The raw confidence shrunk towards the training base rate: the baseline a calibrator has to beat."""
from mice_exp.estimators.base import ConfidenceEstimator
from mice_exp.estimators.inputs import OneConfidence


class ShrunkConfidence(ConfidenceEstimator):
    reads = OneConfidence()

    def __init__(self, weight: float = 0.5):
        self.weight = weight

    def _fit(self, X, y):
        """Nothing beyond the base rate the base class learns."""

    def _predict(self, X):
        return self.weight * X[:, 0] + (1 - self.weight) * self.base_rate_
'''
SHRUNK_YAML = """
key: shrunk
name: Shrunk Confidence
model:
  _target_: mice_exp.estimators.shrunk.ShrunkConfidence
  weight: 0.5
"""


@pytest.mark.filterwarnings("ignore::mice_exp.estimators.FallbackWarning")  # one-label checks: the base rate
def test_a_new_estimator_is_a_module_and_a_yaml(tmp_path, monkeypatch):
    """Its module in the estimators' package (here a folder added to it) and its YAML (here in a conf folder on
    Hydra's search path): scikit-learn's checks find it, a run fits it and saves it as a gate, and the report
    names its row as the YAML does."""
    from mice_exp.llm import runner
    from mice_exp.report import command

    (tmp_path / "estimators").mkdir()
    (tmp_path / "estimators" / "shrunk.py").write_text(SHRUNK_MODULE)
    (tmp_path / "conf" / "estimator").mkdir(parents=True)
    (tmp_path / "conf" / "estimator" / "shrunk.yaml").write_text(SHRUNK_YAML)
    monkeypatch.setattr(mice_exp.estimators, "__path__", [*mice_exp.estimators.__path__, str(tmp_path / "estimators")])
    monkeypatch.delitem(sys.modules, "mice_exp.estimators.shrunk", raising=False)

    (shrunk,) = [cls for cls in estimator_classes() if cls.__name__ == "ShrunkConfidence"]
    estimator = small(shrunk)
    check_estimator(estimator, expected_failed_checks=expected_failed_checks(estimator), on_skip=None)

    monkeypatch.setattr(runner, "is_correct", lambda example, api, args: int(example.id.rsplit("/", 1)[-1]) % 2 == 0)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result, _ = tiny_run(tmp_path, f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"dataset.path={FIXTURE}",
                         "prompt.k_demos=2", "estimator=shrunk", "compare_with=[raw,hre]", "tracking.enabled=true",
                         f"tracking.uri={store}")
    run = MlflowClient(store).get_run(result["run_id"])
    assert run.data.tags["estimator"] == "shrunk" and "gate" in {a.path for a in
                                                                 MlflowClient(store).list_artifacts(run.info.run_id)}
    report = command.build_report(MlflowClient(store), "mice_exp", with_figures=False)
    assert dict(zip(report.table1["estimator"], report.table1["row"])) == {
        "raw": "Raw Confidence", "hre": "HRE", "shrunk": "Shrunk Confidence"}  # each row named by its YAML
    sys.modules.pop("mice_exp.estimators.shrunk", None)


def reads_asked(source: str) -> list[str]:
    """Where ``source`` asks which kind of input an estimator reads: a comparison with an ``input_kind`` or a
    ``reads``, or an ``isinstance`` of one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            operands = node.args[:1]
        if any(isinstance(sub, ast.Attribute) and sub.attr in ("input_kind", "reads")
               for operand in operands for sub in ast.walk(operand)):
            found.append(f"{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_nothing_outside_the_estimators_asks_what_an_estimator_reads():
    assert reads_asked('if e.input_kind == "confidence": pass\nisinstance(e.reads, OneConfidence)') == [
        "1: e.input_kind == 'confidence'", "2: isinstance(e.reads, OneConfidence)"]  # what the check finds
    assert package_findings(reads_asked) == {}

