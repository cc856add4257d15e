"""Linear probes on the LLM's hidden states: the baselines a learned estimator has to beat.

X is one LLM-stage array (``representation``: "last_token", "first_token" or "mean_pool") with its
L layers side by side, [N, L * d]; :func:`mice_exp.protocols.inputs` builds it and sets ``n_layers``
so the estimator can split it back into layers.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from mice_exp.estimators.base import ConfidenceEstimator


class HiddenStateEstimator(ConfidenceEstimator):
    """Reads X = [N, L * d] hidden states; ``n_layers`` (set by the protocol) says where layers end."""

    input_kind = "hidden"

    def _layers(self, X: np.ndarray) -> np.ndarray:
        """X as [N, L, d]."""
        if not self.n_layers or X.shape[1] % self.n_layers:
            raise ValueError(f"{type(self).__name__}: n_layers={self.n_layers} does not split {X.shape[1]} columns "
                             "into layers; build X with mice_exp.protocols.inputs")
        return X.reshape(len(X), self.n_layers, -1)

    def _layer(self, X: np.ndarray, layer: int | None) -> np.ndarray:
        """Layer ``layer`` (1-based, as the feature views count) or the final one (None), [N, d]."""
        states = self._layers(X)
        if layer is not None and not 1 <= layer <= states.shape[1]:
            raise ValueError(f"{type(self).__name__}: layer={layer}; expected 1..{states.shape[1]} or None (final)")
        return states[:, -1 if layer is None else layer - 1]


def probe(C: float, max_iter: int) -> Pipeline:
    """Standardised states into an L2 logistic regression (states have a few huge-magnitude dimensions)."""
    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))


class LinearProbe(HiddenStateEstimator):
    """Logistic regression on one layer's state (default: the final layer).

    Args:
        representation: which LLM-stage array X holds (read by the protocol).
        layer: 1-based layer number, or None for the final layer.
        C: inverse L2 strength of the logistic regression.
        n_layers: how many layers X holds side by side (set by the protocol).
    """

    def __init__(self, representation: str = "last_token", layer: int | None = None, C: float = 1.0,
                 max_iter: int = 1000, n_layers: int | None = None):
        self.representation = representation
        self.layer = layer
        self.C = C
        self.max_iter = max_iter
        self.n_layers = n_layers

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        self.model_ = probe(self.C, self.max_iter).fit(self._layer(X, self.layer), y)

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.model_.predict_proba(self._layer(X, self.layer))[:, 1]


class BestLayerProbe(HiddenStateEstimator):
    """A :class:`LinearProbe` on the layer whose probe predicts best out of fold.

    The holdout protocol hands an estimator its training rows only, so the layer is chosen by
    stratified k-fold cross-validation on them (log loss, a proper score for a confidence), then
    the probe is refitted on all training rows at that layer. With fewer than two calls of a class
    there is nothing to cross-validate and the final layer is used.

    Args:
        representation, C, max_iter, n_layers: as :class:`LinearProbe`.
        cv: folds (fewer when a class has fewer calls).
        seed: shuffles the folds.
    """

    def __init__(self, representation: str = "last_token", C: float = 1.0, max_iter: int = 1000, cv: int = 5,
                 seed: int = 0, n_layers: int | None = None):
        self.representation = representation
        self.C = C
        self.max_iter = max_iter
        self.cv = cv
        self.seed = seed
        self.n_layers = n_layers

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        states = self._layers(X)
        folds = min(self.cv, int(np.bincount(y, minlength=2).min()))
        if folds < 2:
            self.cv_scores_ = np.full(states.shape[1], np.nan)
        else:
            split = StratifiedKFold(folds, shuffle=True, random_state=self.seed)
            self.cv_scores_ = np.array([cross_val_score(probe(self.C, self.max_iter), states[:, i], y, cv=split,
                                                        scoring="neg_log_loss").mean()
                                        for i in range(states.shape[1])])
        self.layer_ = states.shape[1] if folds < 2 else int(np.argmax(self.cv_scores_)) + 1
        self.model_ = probe(self.C, self.max_iter).fit(states[:, self.layer_ - 1], y)

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.model_.predict_proba(self._layer(X, self.layer_))[:, 1]
