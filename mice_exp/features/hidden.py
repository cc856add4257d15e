"""Every layer of one LLM-stage hidden-state array, for estimators that read the states themselves."""

from __future__ import annotations

import numpy as np

from mice_exp.errors import UserError
from mice_exp.features import ARRAYS, FeatureSet


def hidden_states(fs: FeatureSet, name: str) -> np.ndarray:
    """The LLM stage's ``name`` array ("last_token", "first_token", "mean_pool") as float64 [N, L, d]."""
    if name not in ARRAYS:
        raise UserError(f"estimator.model.representation={name!r}; expected one of {', '.join(ARRAYS)}")
    if fs.stage is None:
        raise UserError(f"this estimator reads the LLM's {name} hidden states, but the feature set has no "
                        "LLM-stage output; expected records produced by the LLM stage (mice-exp stage=llm)")
    try:
        return fs.stage.arrays(name).astype(np.float64)
    except (KeyError, FileNotFoundError, ValueError):
        raise UserError(f"the LLM-stage cache {fs.stage.folder} holds no {name} hidden states; expected shard-*.npz "
                        f"files with a {name!r} array [N, L, d] (delete the cache to recompute it)") from None
