"""Named column blocks: how an estimator that reads several inputs side by side learns where each ends.

scikit-learn's convention (``ColumnTransformer``'s output names): X is a DataFrame whose columns are
named ``<block>__<column>``. ``fit`` reads the names from ``feature_names_in_`` and learns the layout
(a probe how many layers its hidden states hold, a field correction where its base's input ends), so
nothing sets it on the estimator from outside. An estimator's declared inputs build these frames
(:mod:`mice_exp.estimators.inputs`) with :func:`side_by_side` and :func:`layers`, which build them anywhere else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a frame is built, not with the estimators
    import pandas as pd

SEPARATOR = "__"


def column_names(X: object) -> list[str] | None:
    """The column names of a DataFrame, None for an array."""
    columns = getattr(X, "columns", None)
    return None if columns is None else [str(c) for c in columns]


def named(X: np.ndarray, names: Sequence[str] | None) -> np.ndarray | pd.DataFrame:
    """``X`` as a frame with columns ``names`` (no copy), or as it is when there are none."""
    if names is None:
        return X
    import pandas as pd

    return pd.DataFrame(X, columns=list(names), copy=False)


def side_by_side(blocks: Mapping[str, np.ndarray | pd.DataFrame]) -> pd.DataFrame:
    """Blocks of rows side by side, columns named ``<block>__<column>``: a frame's own column names,
    an array's column numbers."""
    arrays, names = [], []
    for block, X in blocks.items():
        X_names = column_names(X)
        X = np.asarray(X, dtype=np.float64)
        arrays.append(X)
        names += [f"{block}{SEPARATOR}{c}" for c in (X_names or range(X.shape[1]))]
    return named(np.hstack(arrays), names)


def layers(states: np.ndarray) -> pd.DataFrame:
    """Hidden states [N, L, d] as X [N, L * d]: block ``layer<l>`` holds layer l's d dimensions (1-based)."""
    n, n_layers, d = states.shape
    names = [f"layer{layer}{SEPARATOR}{j}" for layer in range(1, n_layers + 1) for j in range(d)]
    return named(states.reshape(n, n_layers * d), names)


def blocks_of(names: Sequence[str] | None) -> dict[str, list[str]]:
    """Each block's column names (without the block), in column order; {} when there are no names, a name
    has no block or a block's columns are not contiguous (no layout to read)."""
    blocks: dict[str, list[str]] = {}
    for name in names if names is not None else ():
        block, separator, column = str(name).partition(SEPARATOR)
        if not separator or (block in blocks and block != next(reversed(blocks))):
            return {}
        blocks.setdefault(block, []).append(column)
    return blocks
