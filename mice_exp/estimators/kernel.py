"""Nadaraya-Watson kernel regression (NWKR; MICE §4.4), exactly the smoothing behind smECE."""

from __future__ import annotations

import numpy as np

from mice_exp.estimators.base import ConfidenceEstimator
from mice_exp.estimators.inputs import OneConfidence


class KernelRegression(ConfidenceEstimator):
    """Kernel-weighted mean of the training labels around each confidence.

    Reuses relplot rather than re-deriving it: the bandwidth ``sigma_`` is the one
    ``relplot.smECE`` selects on the training data, and the smoother is relplot's reflected
    Gaussian ``KernelSmoother``, the same curve relplot draws in its reliability diagram.
    relplot is imported in ``_fit``: its package imports matplotlib, which the estimators do not need.
    """

    reads = OneConfidence()
    holds = ("relplot.estimators.KernelSmoother", "relplot.kernels.ReflectedGaussianKernel")

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        import relplot
        from relplot.estimators import KernelSmoother
        from relplot.kernels import ReflectedGaussianKernel

        labels = y.astype(float)
        _, self.sigma_ = relplot.smECE(X[:, 0], labels, return_width=True)
        self.smoother_ = KernelSmoother(ReflectedGaussianKernel(self.sigma_)).fit(X, labels)

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.smoother_.predict(X)
