"""Feature views over the LLM stage's output (MICE BERTScore, ACUTE activations) + raw confidence.

``conf/features/<name>.yaml`` names its view class with ``_target_`` (:mod:`mice_exp.features.views`,
scikit-learn transformers); :func:`make_view` builds it in one hop and :func:`fit_features` fits it
on the training rows and assembles the :class:`FeatureSet` the protocols read; a gate hands its saved
fitted view to :func:`transform_features`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from mice_exp.compose import build_object
from mice_exp.discover import package_classes
from mice_exp.errors import UserError
from mice_exp.features.bertscore import cached_bertscore  # noqa: F401 (re-exported: the view cache)
from mice_exp.features.views import FeatureView
from mice_exp.llm.records import ARRAYS, StageOutput
from mice_exp.needs import RAW


@dataclass
class FeatureSet:
    """Rows aligned with the LLM stage's records: labels, splits, raw confidence and the view's matrix."""

    ids: list[str]
    apis: np.ndarray
    splits: np.ndarray
    labels: np.ndarray
    confidence: np.ndarray
    X: np.ndarray
    columns: list[str]
    layer_scores: np.ndarray | None  # [N, L-1] BERTScores when the view has them (for figures)
    sources: dict[str, np.ndarray] = field(default_factory=dict)  # p_true, verbalized, consistency
    stage: StageOutput | None = None  # the LLM-stage output the rows come from (for representations)
    view: Any = None  # the fitted view the columns come from (what a gate saves)

    def rows(self, split: str) -> np.ndarray:
        return self.splits == split

    def confidence_of(self, source: str) -> np.ndarray:
        """The raw confidence, or another confidence source computed for this run."""
        if source == RAW:
            return self.confidence
        if source not in self.sources:
            raise UserError(f"confidence source {source!r} was not computed; add it to sources.use "
                            f"(computed here: {', '.join([RAW, *self.sources])})")
        return self.sources[source]

    def hidden_states(self, name: str) -> np.ndarray:
        """The LLM stage's ``name`` array ("last_token", "first_token", "mean_pool") as float64 [N, L, d]: every
        layer, for estimators that read the states themselves."""
        if name not in ARRAYS:
            raise UserError(f"estimator.model.representation={name!r}; expected one of {', '.join(ARRAYS)}")
        if self.stage is None:
            raise UserError(f"this estimator reads the LLM's {name} hidden states, but the feature set has no "
                            "LLM-stage output; expected records produced by the LLM stage (mice-exp stage=llm)")
        try:
            return self.stage.arrays(name).astype(np.float64)
        except (KeyError, FileNotFoundError, ValueError):
            raise UserError(f"the LLM-stage cache {self.stage.folder} holds no {name} hidden states; expected "
                            f"shard-*.npz files with a {name!r} array [N, L, d] (delete the cache to recompute "
                            "it)") from None

    def representation(self, name: str) -> np.ndarray:
        """x for the miscalibration field: "features" (this view) or an LLM-stage array at the final layer."""
        if name == "features":
            return self.X
        if name not in ARRAYS:
            raise UserError(f"representation={name!r}; expected features or one of {', '.join(ARRAYS)}")
        if self.stage is None:
            raise UserError(f"representation={name!r} needs the LLM stage's hidden states; this feature set has none")
        return self.stage.arrays(name)[:, -1].astype(np.float64)


#: ``_target_`` of the views of gates saved before ``conf/features`` named its classes (their
#: ``gate.json`` holds only ``view``); every config composed now names its class itself.
SAVED_VIEW_TARGETS = {"bertscore": "mice_exp.features.views.BertScoreView",
                      "mean_pool": "mice_exp.features.views.MeanPoolView",
                      "cosine": "mice_exp.features.views.CosineView",
                      "pca": "mice_exp.features.views.PcaView"}


def view_classes() -> list[type[FeatureView]]:
    """Every view class ``conf/features`` entries may name: those defined in this package's modules or exported
    here (one defined elsewhere), found as the estimators are; a gate trusts them in its view file
    (:func:`mice_exp.gate.artifact.trusted_types`), so a new view needs no list there."""
    return package_classes(__name__, __path__, FeatureView, globals())


def make_view(cfg: Mapping[str, Any], cache_dir: Path | None = None, seed: int = 0) -> Any:
    """The unfitted view a ``conf/features`` node names with ``_target_`` (one hop; ``view`` must be its own), with
    what the job sets besides the YAML where the view has it: ``cache_dir`` (where BERTScores are cached; None:
    computed) and ``seed`` (the random state of PCA)."""
    if "_target_" not in cfg and cfg.get("view") in SAVED_VIEW_TARGETS:
        cfg = {**cfg, "_target_": SAVED_VIEW_TARGETS[cfg["view"]]}
    return set_runtime(build_object(cfg, "features", FeatureView, {"name": None, "view": "view"}), cache_dir, seed)


def set_runtime(view: Any, cache_dir: Path | None, seed: int) -> Any:
    """``view`` with what the job sets besides the YAML, where the view has it (:func:`make_view`'s
    ``cache_dir`` and ``seed``); a gate sets them on the fitted view it loads."""
    runtime = {"random_state": seed, "cache_dir": None if cache_dir is None else str(cache_dir)}
    return view.set_params(**{k: v for k, v in runtime.items() if k in view.get_params()})


def build_features(cfg: Mapping[str, Any], stage: StageOutput, features_cache: Path | None, seed: int = 0,
                   sources: Mapping[str, np.ndarray] | None = None) -> FeatureSet:
    """:func:`fit_features` with the view a ``conf/features`` node describes, in one call."""
    return fit_features(make_view(cfg, features_cache, seed), stage, sources)


def fit_features(view: Any, stage: StageOutput, sources: Mapping[str, np.ndarray] | None = None) -> FeatureSet:
    """Fit a clone of ``view`` (:func:`make_view`; the one handed in stays unfitted) on the training rows of an
    LLM-stage output and transform every record (:func:`transform_features`)."""
    from sklearn.base import clone

    train = np.array([r["split"] == "train" for r in stage.records], dtype=bool)
    return transform_features(clone(view).fit(stage, rows=train), stage, sources)


def transform_features(view: Any, stage: StageOutput, sources: Mapping[str, np.ndarray] | None = None) -> FeatureSet:
    """Every record of an LLM-stage output through a fitted ``view`` (a run's, or the one a gate saved: nothing
    is learned from these rows); ``sources`` are the confidence sources computed for this run (the view's
    ``sources`` are appended as columns)."""
    sources = dict(sources or {})
    stage = dataclasses.replace(stage, sources={**stage.sources, **sources})
    records = stage.records
    X = view.transform(stage)
    columns = list(view.get_feature_names_out())
    if X.shape[1] == 0:
        raise UserError(f"features.layers={view.layers!r} with features.confidence={str(view.confidence).lower()} "
                        "selects no column; expected at least one feature")
    # the per-layer scores for a run's figures, read back from the cache the transform filled; a gate's view
    # (no cache) would compute every BERTScore a second time for a figure it never draws
    cached = view.view == "bertscore" and view.layers_ and view.cache_dir is not None
    scores = view.scores(stage) if cached else None
    return FeatureSet(ids=[r["id"] for r in records], apis=np.array([r["api"] for r in records]),
                      splits=np.array([r["split"] for r in records]), labels=np.array([r["label"] for r in records]),
                      confidence=np.array([r["raw_confidence"] for r in records]), X=X, columns=columns,
                      layer_scores=scores, sources=sources, stage=stage, view=view)
