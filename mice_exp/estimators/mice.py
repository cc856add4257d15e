"""The MICE classifiers (MICE §4.4): learned maps from the feature view to P(call is correct)."""

from __future__ import annotations

import numpy as np
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier

from mice_exp.estimators.base import ConfidenceEstimator
from mice_exp.estimators.inputs import ViewColumns


class MiceLogisticRegression(ConfidenceEstimator):
    """MICE LR: L2-regularised logistic regression on the feature view.

    The paper's "L2 regularization strength of 2" is read as lambda = 2, i.e. sklearn's inverse
    strength C = 1 / 2 (the official microsoft/mice_for_cats code could not be consulted; C = 2
    is the other possible reading and only a config change away).
    """

    reads = ViewColumns()

    def __init__(self, C: float = 0.5, max_iter: int = 1000) -> None:
        self.C = C
        self.max_iter = max_iter

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        self.model_ = LogisticRegression(C=self.C, max_iter=self.max_iter).fit(X, y)
        self.n_iter_ = self.model_.n_iter_  # did it converge within max_iter?

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.model_.predict_proba(X)[:, 1]


class MiceRandomForest(ConfidenceEstimator):
    """MICE RF: 1000 trees of depth <= 20 trying 10 features per split; other settings default.

    max_features is capped at the number of features so reduced feature views (ablations) still fit.
    n_jobs (fitting's) defaults to all cores; set it to 1 when the sweep itself already runs jobs in parallel.
    Prediction walks all trees at once (:class:`ForestWalk`).
    """

    reads = ViewColumns()
    holds = ("sklearn.tree._tree.Tree",)  # the trees of a forest saved before pack_forest (gates of earlier versions)

    def __init__(
        self,
        n_estimators: int = 1000,
        max_depth: int = 20,
        max_features: int = 10,
        seed: int = 0,
        n_jobs: int | None = -1,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.max_features = max_features
        self.seed = seed
        self.n_jobs = n_jobs

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        self.model_ = RandomForestClassifier(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            max_features=min(self.max_features, X.shape[1]),
            random_state=self.seed,
            n_jobs=self.n_jobs,
        ).fit(X, y)
        self.walk_ = ForestWalk(self.model_)

    def _predict(self, X: np.ndarray) -> np.ndarray:
        if np.isnan(X).any():  # only sklearn's own walk knows where each split sends a missing value
            return self.model_.predict_proba(X)[:, 1]
        return self.walk_.predict_proba(X)[:, 1]

    def __getstate__(self) -> dict:
        """The fitted forest packed into a few arrays (:func:`pack_forest`): skops writes 1000 trees as
        objects in ~1.8 s and checks their types in ~0.6 s, the arrays in 0.02 s (a gate, ``make run``)."""
        state = {k: v for k, v in super().__getstate__().items() if k != "walk_"}  # rebuilt on loading
        if isinstance(state.get("model_"), RandomForestClassifier):
            state["model_"] = pack_forest(state["model_"])
        return state

    def __setstate__(self, state: dict) -> None:
        if isinstance(state.get("model_"), dict):  # packed; a state from before packing holds the forest itself
            state = state | {"model_": unpack_forest(state["model_"])}
        super().__setstate__(state)
        if "model_" in state:
            self.walk_ = ForestWalk(self.model_)


class ForestWalk:
    """A fitted forest's ``predict_proba`` with every tree walked at once in numpy, bit for bit sklearn's with
    ``n_jobs=1`` (the trees' probabilities summed in tree order; with more jobs sklearn sums in the order its
    threads finish). Why: a gate predicts one row per request, and sklearn's 1000-tree loop took 0.14 s on one
    thread and 0.35 s with ``n_jobs=-1`` (joblib polling its thread pool) on a 2-core CPU: most of what scoring a
    call adds to its forward pass. Here one row takes a few milliseconds."""

    ROWS = 256  # rows walked together: [trees, rows] index arrays stay a few MB

    def __init__(self, forest: RandomForestClassifier) -> None:
        trees = [tree.tree_ for tree in forest.estimators_]
        starts = np.cumsum([0] + [t.node_count for t in trees[:-1]])
        self.roots = starts.astype(np.intp)

        def children(side: str) -> np.ndarray:  # absolute node indices; a leaf keeps -1
            return np.concatenate([np.where(getattr(t, side) < 0, -1, getattr(t, side) + s)
                                   for t, s in zip(trees, starts)]).astype(np.intp)

        self.left, self.right = children("children_left"), children("children_right")
        # a leaf's feature is sklearn's -2; walked rows stay put at leaves, but the lookup X[:, feature] runs for
        # every tree each step, so a leaf reads column 0 (-2 would be out of bounds on a one-column view)
        self.feature = np.maximum(np.concatenate([t.feature for t in trees]), 0).astype(np.intp)
        self.threshold = np.concatenate([t.threshold for t in trees])
        values = np.concatenate([t.value[:, 0, :] for t in trees])  # one output: [nodes, classes]
        total = values.sum(axis=1, keepdims=True)
        self.proba = values / np.where(total == 0.0, 1.0, total)  # each tree's predict_proba of a leaf
        self.depth = max(t.max_depth for t in trees)

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        # sklearn walks float32 features against float64 thresholds
        X32 = np.asarray(X, dtype=np.float32)
        return np.concatenate([self._rows(X32[lo:lo + self.ROWS]) for lo in range(0, len(X32), self.ROWS)])

    def _rows(self, X: np.ndarray) -> np.ndarray:
        node = np.repeat(self.roots[:, None], len(X), axis=1)  # [trees, rows]
        rows = np.arange(len(X))[None, :]
        for _ in range(self.depth):
            inner = self.left[node] >= 0
            if not inner.any():
                break
            go_left = X[rows, self.feature[node]] <= self.threshold[node]
            node = np.where(inner, np.where(go_left, self.left[node], self.right[node]), node)
        # tree by tree, as sklearn's n_jobs=1 loop adds them, then divided by the number of trees
        return np.add.accumulate(self.proba[node], axis=0)[-1] / len(self.roots)


def pack_forest(forest: RandomForestClassifier) -> dict:
    """A fitted forest as plain values and arrays: its attributes but the trees, one tree's attributes
    but its ``tree_`` (the same in every tree but ``random_state``), and all trees' node and value
    arrays concatenated. :func:`unpack_forest` rebuilds it bit for bit."""
    trees = forest.estimators_
    states = [tree.tree_.__getstate__() for tree in trees]
    _, tree_args, _ = trees[0].tree_.__reduce__()  # (n_features, n_classes, n_outputs): every tree's
    return {
        "forest": {k: v for k, v in vars(forest).items() if k != "estimators_"},
        "tree": {k: v for k, v in vars(trees[0]).items() if k not in ("tree_", "random_state")},
        "tree_args": list(tree_args),
        "random_state": np.array([tree.random_state for tree in trees], dtype=np.int64),
        "node_count": np.array([s["node_count"] for s in states], dtype=np.int64),
        "max_depth": np.array([s["max_depth"] for s in states], dtype=np.int64),
        "nodes": np.concatenate([s["nodes"] for s in states]),
        "values": np.concatenate([s["values"] for s in states]),
    }


def unpack_forest(packed: dict) -> RandomForestClassifier:
    """The forest :func:`pack_forest` packed."""
    from sklearn.tree._tree import Tree

    ends = np.cumsum(packed["node_count"])
    trees = []
    for i, end in enumerate(ends):
        start = end - packed["node_count"][i]
        tree_ = Tree(*packed["tree_args"])
        tree_.__setstate__({"max_depth": int(packed["max_depth"][i]), "node_count": int(packed["node_count"][i]),
                            "nodes": packed["nodes"][start:end], "values": packed["values"][start:end]})
        tree = DecisionTreeClassifier.__new__(DecisionTreeClassifier)
        vars(tree).update(packed["tree"], random_state=int(packed["random_state"][i]), tree_=tree_)
        trees.append(tree)
    forest = RandomForestClassifier.__new__(RandomForestClassifier)
    vars(forest).update(packed["forest"], estimators_=trees)
    return forest
