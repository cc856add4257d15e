"""The MICE classifiers (MICE §4.4): learned maps from the feature view to P(call is correct)."""

from __future__ import annotations

import numpy as np
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression

from mice_exp.estimators.base import ConfidenceEstimator


class MiceLogisticRegression(ConfidenceEstimator):
    """MICE LR: L2-regularised logistic regression on the feature view.

    The paper's "L2 regularization strength of 2" is read as lambda = 2, i.e. sklearn's inverse
    strength C = 1 / 2 (the official microsoft/mice_for_cats code could not be consulted; C = 2
    is the other possible reading and only a config change away).
    """

    input_kind = "features"

    def __init__(self, C: float = 0.5, max_iter: int = 1000) -> None:
        self.C = C
        self.max_iter = max_iter

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        self.model_ = LogisticRegression(C=self.C, max_iter=self.max_iter).fit(X, y)

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.model_.predict_proba(X)[:, 1]


class MiceRandomForest(ConfidenceEstimator):
    """MICE RF: 1000 trees of depth <= 20 trying 10 features per split; other settings default.

    max_features is capped at the number of features so reduced feature views (ablations) still fit.
    n_jobs defaults to all cores; set it to 1 when the sweep itself already runs jobs in parallel.
    """

    input_kind = "features"

    def __init__(
        self,
        n_estimators: int = 1000,
        max_depth: int = 20,
        max_features: int = 10,
        seed: int = 0,
        n_jobs: int | None = -1,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.max_features = max_features
        self.seed = seed
        self.n_jobs = n_jobs

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        self.model_ = RandomForestClassifier(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            max_features=min(self.max_features, X.shape[1]),
            random_state=self.seed,
            n_jobs=self.n_jobs,
        ).fit(X, y)

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.model_.predict_proba(X)[:, 1]
