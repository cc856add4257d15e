"""Mahalanobis distance to the training calls' class means, calibrated into a confidence.

The score of a state h is d_incorrect(h)^2 - d_correct(h)^2, the squared Mahalanobis distances to
the mean state of the incorrect and of the correct training calls under one shared, shrunk
covariance (Lee et al. 2018's detector with two classes; with a shared covariance the score is
linear in h, as in LDA). Above 0, h lies closer to the correct calls. A logistic regression on the
score turns it into a probability; it is fitted on cross-fitted scores (each training call scored
by means and covariance estimated without its fold), because in-sample distances are optimistic.
"""

from __future__ import annotations

import numpy as np
from sklearn.covariance import LedoitWolf, ShrunkCovariance
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.preprocessing import StandardScaler

from mice_exp.estimators.hidden import HiddenStateEstimator


class Geometry:
    """Class means and the shared precision of standardised states (one fit, no sklearn params)."""

    def __init__(self, H: np.ndarray, y: np.ndarray, shrinkage: float | None):
        # Standardised first, so shrinking towards the identity treats every dimension alike.
        self.scaler = StandardScaler().fit(H)
        Z = self.scaler.transform(H)
        self.means = np.stack([Z[y == 0].mean(axis=0), Z[y == 1].mean(axis=0)])
        centered = Z - self.means[y]
        covariance = LedoitWolf(assume_centered=True) if shrinkage is None else \
            ShrunkCovariance(shrinkage=shrinkage, assume_centered=True)
        self.precision = covariance.fit(centered).precision_

    def distances(self, H: np.ndarray) -> np.ndarray:
        """Squared Mahalanobis distances [N, 2] to the incorrect (column 0) and correct (1) mean."""
        Z = self.scaler.transform(H)
        diff = Z[:, None, :] - self.means[None]
        return np.einsum("nkd,de,nke->nk", diff, self.precision, diff)

    def score(self, H: np.ndarray) -> np.ndarray:
        d = self.distances(H)
        return d[:, 0] - d[:, 1]


class MahalanobisConfidence(HiddenStateEstimator):
    """P(correct) from the distance difference to the class means of one layer's states.

    Args:
        representation, layer: as :class:`mice_exp.estimators.hidden.LinearProbe`.
        shrinkage: covariance shrinkage in [0, 1], or None for Ledoit-Wolf's estimate.
        cv: folds for the cross-fitted training scores (fewer when a class has fewer calls; with
            fewer than two calls of a class the calibration uses in-sample scores).
        seed: shuffles the folds.
    """

    holds = (f"{Geometry.__module__}.{Geometry.__qualname__}",)

    def __init__(self, representation: str = "last_token", layer: int | None = None, shrinkage: float | None = None,
                 cv: int = 5, seed: int = 0):
        self.representation = representation
        self.layer = layer
        self.shrinkage = shrinkage
        self.cv = cv
        self.seed = seed

    def _cross_fitted_scores(self, H: np.ndarray, y: np.ndarray) -> np.ndarray:
        folds = min(self.cv, int(np.bincount(y, minlength=2).min()))
        if folds < 2:
            return Geometry(H, y, self.shrinkage).score(H)
        scores = np.empty(len(y))
        for fit, held in StratifiedKFold(folds, shuffle=True, random_state=self.seed).split(H, y):
            scores[held] = Geometry(H[fit], y[fit], self.shrinkage).score(H[held])
        return scores

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        H = self._layer(X, self.layer)
        self.calibrator_ = LogisticRegression().fit(self._cross_fitted_scores(H, y)[:, None], y)
        self.geometry_ = Geometry(H, y, self.shrinkage)

    def distances(self, X: np.ndarray) -> np.ndarray:
        """Squared distances [N, 2] of each row's state to the incorrect and the correct training mean."""
        return self.geometry_.distances(self._layer(np.asarray(X, dtype=np.float64), self.layer))

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.calibrator_.predict_proba(self.geometry_.score(self._layer(X, self.layer))[:, None])[:, 1]
