"""Linear probes on the LLM's hidden states: the baselines a learned estimator has to beat.

X is one LLM-stage array (``representation``: "last_token", "first_token" or "mean_pool") with its
L layers side by side, [N, L * d], columns named ``layer<l>__<j>`` (:func:`mice_exp.estimators.blocks.layers`;
the estimator's ``design`` builds it, :class:`~mice_exp.estimators.inputs.HiddenStates`): ``fit`` learns
``n_layers_`` from the names. X without layer names is one layer's state.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from mice_exp.estimators.base import ConfidenceEstimator
from mice_exp.estimators.blocks import blocks_of
from mice_exp.estimators.inputs import HiddenStates


class HiddenStateEstimator(ConfidenceEstimator):
    """Reads X = [N, L * d] hidden states of its ``representation``; learns ``n_layers_`` from X's column names."""

    reads = HiddenStates()
    representation: str

    def _learn_layout(self) -> None:
        blocks = blocks_of(getattr(self, "feature_names_in_", None))
        if not blocks or not all(name.startswith("layer") for name in blocks):
            self.n_layers_ = 1  # no layer names: X is one layer's state
            return
        expected = [f"layer{layer}" for layer in range(1, len(blocks) + 1)]
        widths = {len(columns) for columns in blocks.values()}
        if list(blocks) != expected or len(widths) != 1:
            raise ValueError(f"{type(self).__name__}: X's layer blocks {list(blocks)[:4]}... of widths "
                             f"{sorted(widths)} are not layers 1..L of one width; build X with "
                             "mice_exp.estimators.blocks.layers")
        self.n_layers_ = len(blocks)

    def _layers(self, X: np.ndarray) -> np.ndarray:
        """X as [N, L, d]."""
        return X.reshape(len(X), self.n_layers_, -1)

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
    """

    def __init__(self, representation: str = "last_token", layer: int | None = None, C: float = 1.0,
                 max_iter: int = 1000):
        self.representation = representation
        self.layer = layer
        self.C = C
        self.max_iter = max_iter

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        self.model_ = probe(self.C, self.max_iter).fit(self._layer(X, self.layer), y)
        self.n_iter_ = self.model_[-1].n_iter_  # did it converge within max_iter?

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.model_.predict_proba(self._layer(X, self.layer))[:, 1]


class BestLayerProbe(HiddenStateEstimator):
    """A :class:`LinearProbe` on the layer whose probe predicts best out of fold.

    The holdout protocol hands an estimator its training rows only, so the layer is chosen by
    stratified k-fold cross-validation on them (log loss, a proper score for a confidence), then
    the probe is refitted on all training rows at that layer. With fewer than two calls of a class
    there is nothing to cross-validate and the final layer is used.

    Args:
        representation, C, max_iter: as :class:`LinearProbe`.
        cv: folds (fewer when a class has fewer calls).
        seed: shuffles the folds.
    """

    def __init__(self, representation: str = "last_token", C: float = 1.0, max_iter: int = 1000, cv: int = 5,
                 seed: int = 0):
        self.representation = representation
        self.C = C
        self.max_iter = max_iter
        self.cv = cv
        self.seed = seed

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
        self.n_iter_ = self.model_[-1].n_iter_

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.model_.predict_proba(self._layer(X, self.layer_))[:, 1]
