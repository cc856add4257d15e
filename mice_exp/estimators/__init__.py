"""Confidence estimators: sklearn classifiers whose predict_proba[:, 1] is P(the tool call is correct).

Each class declares what it reads (``reads``, :mod:`mice_exp.estimators.inputs`): one confidence, the
feature view, every layer of an LLM hidden-state array, or a base's input beside a representation; its
``design`` builds that X from a run's feature set. Build them from ``conf/estimator/<name>.yaml`` with
``hydra.utils.instantiate(cfg.estimator.model)``; a new estimator is its module in this package and the
YAML whose ``_target_`` names it (one defined elsewhere: exported here): :func:`estimator_classes` finds
it, and a gate trusts it (:func:`mice_exp.gate.artifact.trusted_types`).
"""

from __future__ import annotations

from mice_exp.discover import package_classes
from mice_exp.estimators.base import ConfidenceEstimator, FallbackWarning
from mice_exp.estimators.field import FieldCorrection
from mice_exp.estimators.hidden import BestLayerProbe, LinearProbe
from mice_exp.estimators.histogram import HistogramRegression
from mice_exp.estimators.kernel import KernelRegression
from mice_exp.estimators.mahalanobis import MahalanobisConfidence
from mice_exp.estimators.mice import MiceLogisticRegression, MiceRandomForest
from mice_exp.estimators.raw import RawConfidence
from mice_exp.estimators.recalibration import IsotonicCalibration, PlattScaling, TemperatureScaling

__all__ = [
    "BestLayerProbe",
    "ConfidenceEstimator",
    "FallbackWarning",
    "FieldCorrection",
    "HistogramRegression",
    "IsotonicCalibration",
    "KernelRegression",
    "LinearProbe",
    "MahalanobisConfidence",
    "MiceLogisticRegression",
    "MiceRandomForest",
    "PlattScaling",
    "RawConfidence",
    "TemperatureScaling",
    "estimator_classes",
]


def estimator_classes() -> list[type[ConfidenceEstimator]]:
    """Every concrete estimator class defined in this package's modules or exported here (one defined elsewhere),
    the classes ``conf/estimator`` entries name."""
    return package_classes(__name__, __path__, ConfidenceEstimator, globals())
