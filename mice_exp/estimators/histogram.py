"""Histogram regression (HRE; MICE §4.4): recalibrate by the training accuracy of the confidence bin."""

from __future__ import annotations

import numpy as np

from mice_exp.estimators.base import ConfidenceEstimator
from mice_exp.estimators.inputs import OneConfidence
from mice_exp.metrics.binning import equal_width_bins


class HistogramRegression(ConfidenceEstimator):
    """Bins [0, 0.04), [0.04, 0.08), ..., [0.96, 1.0] for the default 25 bins.

    A value on an edge goes to the upper bin and 1.0 to the last bin. A bin with no training
    example predicts the training base rate: with no evidence about that confidence range,
    the overall accuracy is the calibrated guess.
    """

    reads = OneConfidence()

    def __init__(self, n_bins: int = 25) -> None:
        self.n_bins = n_bins

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        bins = equal_width_bins(X[:, 0], self.n_bins)
        size = np.bincount(bins, minlength=self.n_bins)
        correct = np.bincount(bins, weights=y, minlength=self.n_bins)
        self.bin_accuracy_ = np.divide(
            correct, size, out=np.full(self.n_bins, self.base_rate_), where=size > 0
        )

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.bin_accuracy_[equal_width_bins(X[:, 0], self.n_bins)]
