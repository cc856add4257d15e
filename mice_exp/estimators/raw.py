"""The raw-confidence baseline (MICE §4.4): the LLM's own token-probability confidence, unchanged."""

from __future__ import annotations

import numpy as np

from mice_exp.estimators.base import ConfidenceEstimator
from mice_exp.estimators.inputs import OneConfidence


class RawConfidence(ConfidenceEstimator):
    """Returns the raw confidence as is; fit only validates, since there is nothing to learn."""

    reads = OneConfidence()
    learns = False

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        """Nothing to learn: MICE uses neither the training nor the validation set for it."""

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return X[:, 0]
