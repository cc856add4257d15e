"""Feature views as scikit-learn transformers over the LLM stage's output (``conf/features``).

Each view's ``__init__`` only stores its parameters (the YAML's keys); ``fit(stage, rows=...)``
learns what it needs from the training rows (the layers the stage has and, for PCA, one projection
per layer); ``transform(stage)`` gives the matrix, one row per record, followed by the raw
confidence and any extra confidence sources. The input ``stage`` is a
:class:`~mice_exp.llm.records.StageOutput`: records and arrays, never a folder the view reads itself.
A fitted view holds only numbers and scikit-learn objects, so skops can save it: a gate keeps the
run's fitted view (a PCA view's projections included) and transforms new queries with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.decomposition import PCA
from sklearn.utils.validation import check_is_fitted

from mice_exp.errors import UserError
from mice_exp.features.bertscore import cached_bertscore, warm_bertscores
from mice_exp.features.layers import NAMED, select_layers
from mice_exp.features.pooled import cosine_to_last, mean_pool
from mice_exp.llm.records import StageOutput
from mice_exp.needs import Needs


class FeatureView(TransformerMixin, BaseEstimator):
    """Columns of one view of the LLM stage, then ``confidence`` (the raw confidence) and ``sources``."""

    #: What ``features.view`` calls this view (tags, gate identity, records-file checks).
    view: ClassVar[str]
    #: Record fields a published records file must hold for this view.
    record_fields: ClassVar[tuple[str, ...]] = ()
    #: LLM-stage arrays (hidden states) its layers are read from; a records file has none (the run replays them).
    arrays: ClassVar[tuple[str, ...]] = ()

    def __init__(self, layers: str | Sequence[int] = "all", confidence: bool = True, sources: Sequence[str] = ()):
        self.layers = layers
        self.confidence = confidence
        self.sources = sources

    # -- what subclasses define
    def _layer_numbers(self, n_layers: int) -> list[int]:
        """The layers this view can select from (1-based) in a model with ``n_layers`` layers."""
        return list(range(1, n_layers + 1))

    def _fit_block(self, stage: StageOutput, rows: np.ndarray) -> None:
        """Learn the view's own state from the training rows (stateless views: nothing)."""

    def _block(self, stage: StageOutput) -> tuple[np.ndarray, list[str]]:
        raise NotImplementedError

    def needs(self) -> Needs:
        """Its extra confidence sources (``features.sources``) and, when it reads layers, their arrays and record
        fields (``layers: none``, as ``conf_only``, reads the raw confidence alone)."""
        layers = self.layers != "none"
        return Needs.of(sources=self.sources, arrays=self.arrays if layers else (),
                        record_fields=self.record_fields if layers else ())

    def on_device(self, device: str) -> FeatureView:
        """The view computing its features on ``device`` where it runs a model of its own (where a gate told to run
        elsewhere than where it was fitted runs); views that run none: unchanged."""
        return self

    def reads_states(self) -> bool:
        """Whether fitting or transforming reads the LLM stage's hidden states (before any data is seen)."""
        return bool(self.needs().arrays)

    # -- the transformer
    def validate(self) -> None:
        """Parameter checks that need no data (run by :func:`mice_exp.config.check_config` before any model loads)."""
        if isinstance(self.layers, str) and self.layers not in NAMED:
            raise UserError(f"features.layers={self.layers!r}; expected one of {', '.join(NAMED)} "
                            "or a list of layer numbers")

    def check_training_calls(self, n_train: int) -> None:
        """What the number of training calls alone can refuse, before the LLM stage and the run's MLflow run
        (:meth:`mice_exp.pipeline.Pipeline.check_inputs`); views that learn nothing refuse nothing."""

    def fit(self, stage: StageOutput, y: Any = None, rows: np.ndarray | None = None) -> FeatureView:
        """Learn from the records ``rows`` (a boolean mask; default: every record) of ``stage``."""
        self.validate()
        self.n_layers_ = stage.n_layers
        self.layers_ = select_layers(self.layers, self._layer_numbers(self.n_layers_), self.n_layers_)
        self._fit_block(stage, np.ones(len(stage.records), bool) if rows is None else np.asarray(rows, bool))
        return self

    def transform(self, stage: StageOutput) -> np.ndarray:
        """[N, columns] for every record of ``stage``; names: :meth:`get_feature_names_out`."""
        check_is_fitted(self, "layers_")
        if stage.n_layers != self.n_layers_:
            raise UserError(f"the {self.view} view was fitted on an LLM with {self.n_layers_} layers; "
                            f"this one has {stage.n_layers}; expected the same LLM")
        X, columns = self._block(stage) if self.layers_ else (np.zeros((len(stage.records), 0)), [])
        if self.confidence:
            X, columns = np.column_stack([X, [r["raw_confidence"] for r in stage.records]]), [*columns, "confidence"]
        for name in self.sources:
            if name not in stage.sources:
                raise UserError(f"features.sources lists {name!r}, which is not in sources.use")
            values = np.array([np.nan if v is None else v for v in stage.sources[name]], dtype=np.float64)
            X, columns = np.column_stack([X, values]), [*columns, name]
        self.feature_names_out_ = columns
        return X.astype(np.float64)

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        check_is_fitted(self, "feature_names_out_")
        return np.asarray(self.feature_names_out_, dtype=object)


class BertScoreView(FeatureView):
    """MICE: BERTScore F1 of each layer's logit-lens string against the output (layers 1..L-1).

    ``cache_dir`` (set by the job, not the YAML): where BERTScores are cached per stage and encoder;
    None computes them (the gate's one batch of queries)."""

    view = "bertscore"
    record_fields = ("layer_strings",)

    def __init__(self, layers: str | Sequence[int] = "all", confidence: bool = True, sources: Sequence[str] = (),
                 encoder: dict | None = None, cache_dir: str | Path | None = None):
        super().__init__(layers, confidence, sources)
        self.encoder = encoder
        self.cache_dir = cache_dir

    def _layer_numbers(self, n_layers: int) -> list[int]:
        return list(range(1, n_layers))

    def on_device(self, device: str) -> BertScoreView:
        """BERTScore's encoder on ``device`` (a gate fitted with it on a GPU serves on a CPU, and the other way); set in
        place, as ``set_params`` sets it."""
        return self.set_params(encoder={**self._encoder(), "device": device})

    def _encoder(self) -> dict:
        return dict(self.encoder or {"model": None, "num_layers": 6})

    def scores(self, stage: StageOutput) -> np.ndarray:
        """[N, L-1] BERTScores of every layer (cached when ``cache_dir`` is set)."""
        return cached_bertscore(stage, Path(self.cache_dir) if self.cache_dir else None, self._encoder())

    def warm(self, stages: Sequence[StageOutput]) -> int:
        """Fill the BERTScore caches of many stage outputs with each distinct call scored once
        (:func:`~mice_exp.features.bertscore.warm_bertscores`); nothing without a cache folder."""
        return warm_bertscores(stages, Path(self.cache_dir), self._encoder()) if self.cache_dir else 0

    def _block(self, stage: StageOutput) -> tuple[np.ndarray, list[str]]:
        return self.scores(stage)[:, [i - 1 for i in self.layers_]], [f"bertscore_L{i}" for i in self.layers_]


class MeanPoolView(FeatureView):
    """ACUTE: each selected layer's activations mean-pooled over the generated call, side by side."""

    view = "mean_pool"
    arrays = ("mean_pool",)

    def _block(self, stage: StageOutput) -> tuple[np.ndarray, list[str]]:
        return mean_pool(stage.arrays("mean_pool"), self.layers_)


class CosineView(FeatureView):
    """ACUTE: cosine similarity of each layer's pooled vector (layers 1..L-1) to the last layer's."""

    view = "cosine"
    arrays = ("mean_pool",)

    def _layer_numbers(self, n_layers: int) -> list[int]:
        return list(range(1, n_layers))

    def _block(self, stage: StageOutput) -> tuple[np.ndarray, list[str]]:
        return cosine_to_last(stage.arrays("mean_pool"), self.layers_)


class PcaView(FeatureView):
    """ACUTE: the top ``components`` principal components of each selected layer's pooled vector,
    fitted on the training rows only (``pcas_``: one scikit-learn PCA per layer)."""

    view = "pca"
    arrays = ("mean_pool",)

    def __init__(self, layers: str | Sequence[int] = "all", confidence: bool = True, sources: Sequence[str] = (),
                 components: int = 10, random_state: int = 0):
        super().__init__(layers, confidence, sources)
        self.components = components
        self.random_state = random_state

    def check_training_calls(self, n_train: int) -> None:
        if self.layers != "none" and int(self.components) > n_train:
            raise UserError(f"features.components={self.components}: the PCA view fits on {n_train} training "
                            f"calls, which give at most {n_train} components; expected more training calls or "
                            "fewer components")

    def _fit_block(self, stage: StageOutput, rows: np.ndarray) -> None:
        self.pcas_ = []
        pooled = stage.arrays("mean_pool") if self.layers_ else None
        for i in self.layers_:
            x = pooled[rows, i - 1]
            if int(self.components) > min(x.shape):  # shrinking it would still be labelled pca<components>
                raise UserError(f"features.components={self.components}: the PCA view fits on {len(x)} training "
                                f"rows of {x.shape[1]}-dimensional states, which give at most {min(x.shape)} "
                                "components; expected more training calls or fewer components")
            self.pcas_.append(PCA(n_components=int(self.components), random_state=self.random_state).fit(x))

    def _block(self, stage: StageOutput) -> tuple[np.ndarray, list[str]]:
        pooled = stage.arrays("mean_pool")
        blocks = [pca.transform(pooled[:, i - 1]) for i, pca in zip(self.layers_, self.pcas_)]
        names = [f"pca_L{i}_{j}" for i, pca in zip(self.layers_, self.pcas_) for j in range(pca.n_components_)]
        return np.concatenate(blocks, axis=1), names

