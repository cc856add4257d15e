"""Wall time of the estimation stage on 750 examples: the five paper estimators on the BERTScore
view and their metrics, then the same with the permutation tests against HRE and NWKR.

The feature matrix is synthetic but shaped like SmolLM2's BERTScore view (29 layers + raw
confidence, 8 / 3 / 4 examples per API for 50 APIs) with labels that depend on the
features, so the random forest grows real trees. BERTScore's own encoding is excluded
(it is cached like the LLM stage).

    .venv/bin/python benchmarks/estimation.py
"""

from __future__ import annotations

import time

import numpy as np

from mice_exp.compose import as_plain, compose_config
from mice_exp.estimation import Study
from mice_exp.features import FeatureSet
from mice_exp.protocols import make_protocol


def synthetic_bertscore_view(n_apis: int = 50, per_api: tuple[int, int, int] = (8, 3, 4), layers: int = 29,
                             seed: int = 0) -> FeatureSet:
    rng = np.random.default_rng(seed)
    splits = np.concatenate([np.repeat(["train", "validation", "test"], per_api) for _ in range(n_apis)])
    n = len(splits)
    depth = np.linspace(0.2, 0.9, layers)
    quality = rng.normal(size=n)
    scores = np.clip(depth + 0.05 * quality[:, None] + 0.05 * rng.normal(size=(n, layers)), 0, 1)
    confidence = 1 / (1 + np.exp(-(1.5 * quality + rng.normal(size=n))))
    labels = (rng.random(n) < 1 / (1 + np.exp(-(2 * quality - 0.5)))).astype(int)
    X = np.column_stack([scores, confidence])
    return FeatureSet(ids=[f"x/{i}" for i in range(n)], apis=np.repeat([f"api{i}" for i in range(n_apis)], sum(per_api)),
                      splits=splits, labels=labels, confidence=confidence, X=X,
                      columns=[f"bertscore_L{i}" for i in range(1, layers + 1)] + ["confidence"], layer_scores=scores)


def main() -> None:
    fs = synthetic_bertscore_view()
    for tested in (False, True):
        cfg = as_plain(compose_config(["estimator=mice_rf", "compare_with=[raw,hre,nwkr,mice_lr]",
                                       *([] if tested else ["permutations=0"])]))
        start = time.perf_counter()
        rows = make_protocol(cfg["protocol"]).run(Study.from_config(cfg), fs).rows
        elapsed = time.perf_counter() - start
        print(f"{len(fs.ids)} examples, {', '.join(r.name for r in rows)}: fit + predict + metrics"
              + (" + the permutation tests of MICE RF vs HRE and NWKR on 5 metrics, each drawn until decided"
                 if tested else "")
              + f": {elapsed:.1f} s")


if __name__ == "__main__":
    main()
