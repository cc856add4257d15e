"""Feature views over the LLM stage's cache (MICE BERTScore, ACUTE activations) + raw confidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from filelock import FileLock

from mice_exp.cache import read_intact, read_npz, stable_hash, write_npz
from mice_exp.errors import UserError
from mice_exp.features.bertscore import bertscore_matrix, encoder_id
from mice_exp.features.layers import NAMED, select_layers
from mice_exp.features.pooled import cosine_to_last, layer_pca, mean_pool
from mice_exp.llm.records import ARRAYS, StageOutput

VIEWS = ("bertscore", "mean_pool", "cosine", "pca")


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

    def rows(self, split: str) -> np.ndarray:
        return self.splits == split

    def confidence_of(self, source: str) -> np.ndarray:
        """The raw confidence, or another confidence source computed for this run."""
        if source == "raw":
            return self.confidence
        if source not in self.sources:
            raise UserError(f"confidence source {source!r} was not computed; add it to sources.use "
                            f"(computed here: {', '.join(['raw', *self.sources])})")
        return self.sources[source]


    def representation(self, name: str) -> np.ndarray:
        """x for the miscalibration field: "features" (this view) or an LLM-stage array at the final layer."""
        if name == "features":
            return self.X
        if name not in ARRAYS:
            raise UserError(f"representation={name!r}; expected features or one of {', '.join(ARRAYS)}")
        if self.stage is None:
            raise UserError(f"representation={name!r} needs the LLM stage's hidden states; this feature set has none")
        return self.stage.arrays(name)[:, -1].astype(np.float64)


def cached_bertscore(stage: StageOutput, features_cache: Path | None, encoder: Mapping[str, Any]) -> np.ndarray:
    """BERTScores for one LLM-stage output, computed once per encoder and shared by every job
    (``features_cache=None``: computed, not cached, as the gate does for one batch of queries)."""
    records = stage.records
    if features_cache is None:
        return bertscore_matrix(records, encoder)
    path = features_cache / f"{stage.key}-bertscore-{stable_hash(encoder_id(encoder))}.npz"
    stored = read_intact(path, read_npz)  # a damaged file is set aside and recomputed
    if stored is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            stored = read_intact(path, read_npz)  # another job may have computed it meanwhile
            if stored is None:
                stored = {"ids": np.array([r["id"] for r in records]), "f1": bertscore_matrix(records, encoder)}
                write_npz(path, stored)
    if list(stored["ids"]) != [r["id"] for r in records]:
        raise UserError(f"{path} does not match the LLM-stage records; delete it to recompute")
    return stored["f1"]


def check_features(cfg: Mapping[str, Any]) -> None:
    """Fail fast on an unknown view or layer-selection name."""
    if cfg["view"] not in VIEWS:
        raise UserError(f"features.view={cfg['view']!r}; expected one of {', '.join(VIEWS)}")
    if isinstance(cfg["layers"], str) and cfg["layers"] not in NAMED:
        raise UserError(f"features.layers={cfg['layers']!r}; expected one of {', '.join(NAMED)} "
                        "or a list of layer numbers")


def build_features(cfg: Mapping[str, Any], stage: StageOutput, features_cache: Path | None, seed: int = 0,
                   sources: Mapping[str, np.ndarray] | None = None) -> FeatureSet:
    """Assemble the configured view (``conf/features``) for every record of an LLM-stage output;
    ``features.sources`` names extra confidence sources appended as columns."""
    check_features(cfg)
    view = cfg["view"]
    records = stage.records
    n_layers = stage.n_layers
    splits = np.array([r["split"] for r in records])
    scores = None
    if view == "bertscore":
        layers = select_layers(cfg["layers"], list(range(1, n_layers)), n_layers)
        if layers:  # confidence only (layers: none) needs no encoder
            scores = cached_bertscore(stage, features_cache, cfg["encoder"])
        X, columns = (scores[:, [i - 1 for i in layers]] if layers else np.zeros((len(records), 0)),
                      [f"bertscore_L{i}" for i in layers])
    else:
        pooled = stage.arrays("mean_pool")
        if view == "cosine":
            layers = select_layers(cfg["layers"], list(range(1, n_layers)), n_layers)
            X, columns = cosine_to_last(pooled, layers)
        else:
            layers = select_layers(cfg["layers"], list(range(1, n_layers + 1)), n_layers)
            X, columns = (mean_pool(pooled, layers) if view == "mean_pool" else
                          layer_pca(pooled, layers, splits == "train", int(cfg["components"]), seed))
    confidence = np.array([r["raw_confidence"] for r in records])
    if cfg.get("confidence", True):
        X, columns = np.column_stack([X, confidence]), columns + ["confidence"]
    sources = dict(sources or {})
    for name in cfg.get("sources", []):
        if name not in sources:
            raise UserError(f"features.sources lists {name!r}, which is not in sources.use")
        X, columns = np.column_stack([X, sources[name]]), columns + [name]
    if X.shape[1] == 0:
        raise UserError(f"features {cfg.get('name')!r} select no layer and no confidence; expected at least one feature")
    return FeatureSet(ids=[r["id"] for r in records], apis=np.array([r["api"] for r in records]), splits=splits,
                      labels=np.array([r["label"] for r in records]), confidence=confidence,
                      X=X.astype(np.float64), columns=columns, layer_scores=scores, sources=sources, stage=stage)
