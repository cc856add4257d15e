"""Reference rows are in-domain in every protocol, so zero-shot marks compare with the rows Table 1 shows."""

from __future__ import annotations

import numpy as np

from mice_exp.compose import as_plain, compose_config
from mice_exp.estimation import Study
from mice_exp.features import FeatureSet
from mice_exp.protocols import Loao, holdout


def feature_set(n_apis: int = 4, per_api: int = 15, seed: int = 0) -> FeatureSet:
    rng = np.random.default_rng(seed)
    n = n_apis * per_api
    y = (rng.random(n) < 0.6).astype(int)
    confidence = np.clip(0.35 + 0.4 * y + rng.normal(0, 0.2, n), 0.01, 0.99)
    X = np.column_stack([confidence, y + rng.normal(0, 0.8, n)])
    splits = np.array((["train"] * 8 + ["validation"] * 3 + ["test"] * 4) * n_apis)
    return FeatureSet(ids=[f"ex{i}" for i in range(n)], apis=np.repeat([f"api{a}" for a in range(n_apis)], per_api),
                      splits=splits, labels=y, confidence=confidence, X=X, columns=["f", "confidence"],
                      layer_scores=None)


def test_a_leave_one_api_out_run_compares_with_the_holdout_reference_rows():
    fs = feature_set()
    cfg = as_plain(compose_config(["protocol=loao", "estimator=mice_lr", "compare_with=[raw,hre,nwkr]",
                                   "permutations=50", "n_jobs=1", "risk=medium"]))
    study = Study.from_config(cfg)
    rows = Loao().run(study, fs).rows
    for row in rows[:-1]:  # each reference row is exactly the holdout row Table 1 displays
        expected, _ = holdout(study.candidate(row.key, "compare_with").estimator, fs)
        np.testing.assert_array_equal(row.p, expected)
    main = rows[-1]
    assert main.estimator is None  # zero-shot: pooled folds, no single model
    for metric, marks in main.marks.items():
        for ref, mark in (("hre", "*"), ("nwkr", "†")):
            if mark in marks:
                reference = next(r for r in rows if r.key == ref).metrics[metric]
                assert (main.metrics[metric] < reference) if metric == "smece" else (main.metrics[metric] > reference)
