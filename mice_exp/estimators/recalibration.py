"""Textbook post-hoc recalibrators of a single confidence (MICE footnote 7; calibration chapter)."""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit, logit
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

from mice_exp.estimators.base import ConfidenceEstimator
from mice_exp.estimators.inputs import OneConfidence


def _clipped_logit(confidence: np.ndarray, eps: float) -> np.ndarray:
    """Logit of confidences kept eps away from 0 and 1, where it would be infinite."""
    return logit(np.clip(confidence, eps, 1 - eps))


class PlattScaling(ConfidenceEstimator):
    """Logistic regression on the logit of the confidence: p = sigmoid(a * logit(c) + b).

    sklearn's default L2 penalty (C = 1) is negligible on two parameters yet keeps the fit
    finite when the training confidences separate the classes perfectly.
    """

    reads = OneConfidence()

    def __init__(self, C: float = 1.0, eps: float = 1e-6) -> None:
        self.C = C
        self.eps = eps

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        self.model_ = LogisticRegression(C=self.C).fit(_clipped_logit(X, self.eps), y)

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.model_.predict_proba(_clipped_logit(X, self.eps))[:, 1]


class IsotonicCalibration(ConfidenceEstimator):
    """Monotone step function of the confidence; clips inputs outside the training range."""

    reads = OneConfidence()

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        self.model_ = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(X[:, 0], y)

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.model_.predict(X[:, 0])


class TemperatureScaling(ConfidenceEstimator):
    """p = sigmoid(logit(c) / T), with the one scalar T minimising the training log loss.

    T is searched on a log scale in [1e-2, 1e2]; T > 1 softens overconfidence, T < 1 sharpens.
    Unlike Platt scaling it has no bias term, so it cannot move p = 0.5.
    """

    reads = OneConfidence()

    def __init__(self, eps: float = 1e-6) -> None:
        self.eps = eps

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        z = _clipped_logit(X[:, 0], self.eps)

        def log_loss(log_temperature: float) -> float:
            scaled = z / np.exp(log_temperature)
            return float(np.mean(np.logaddexp(0.0, scaled) - y * scaled))

        best = minimize_scalar(log_loss, bounds=(np.log(1e-2), np.log(1e2)), method="bounded")
        self.temperature_ = float(np.exp(best.x))

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return expit(_clipped_logit(X[:, 0], self.eps) / self.temperature_)
