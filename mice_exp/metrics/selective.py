"""Selective prediction: how much better the calls an estimator trusts most are than the rest.

Sort the test calls by confidence, most confident first, and keep the top k (coverage k/n).

* Risk-coverage curve (Geifman & El-Yaniv 2017): risk(k) = error rate of the k kept calls, for
  k = 1..n. AURC (Geifman et al. 2019, "Bias-reduced uncertainty estimation for deep neural
  classifiers") is its mean over the n coverages, (1/n) sum_k risk(k): lower is better.
* Prediction-rejection ratio (Malinin et al. 2017, "Incorporating uncertainty into deep learning
  for spoken language assessment"; Malinin & Gales 2021, "Uncertainty estimation in autoregressive
  structured prediction"; lm-polygraph's ``PredictionRejectionArea``): the rejection curve is the
  accuracy of the kept calls, acc(k) = 1 - risk(k), and its area A = (1/n) sum_k acc(k) (lm-polygraph's
  discrete area with max_rejection = 1). Random rejection keeps the base rate at every k, so
  A_random = mean(y); the oracle keeps every correct call first. Then

      PRR = (A - A_random) / (A_oracle - A_random)

  1 is the oracle, 0 random, below 0 worse than random: higher is better. Note A = 1 - AURC.

Tied confidences are ordered fairly rather than by index: each call of a tie group counts with the
group's accuracy, which is exactly the expected curve over random orderings of the ties (so a
constant confidence scores PRR 0, not whatever the data's order gives). lm-polygraph breaks ties
by argsort instead.

A single-class test set makes every ordering the same (oracle = random), so PRR and AURC are NaN
there: they measure the ranking, and there is none to judge.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from mice_exp.metrics.validation import check_pair


def _kept_accuracy(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """acc(k) for k = 1..n, most confident first, ties counted at their group's mean accuracy."""
    order = np.argsort(-p, kind="stable")
    p_sorted, y_sorted = p[order], y[order].astype(float)
    _, group, sizes = np.unique(p_sorted, return_inverse=True, return_counts=True)
    tie_mean = np.bincount(group, weights=y_sorted) / sizes
    return np.cumsum(tie_mean[group]) / np.arange(1, p.size + 1)


def risk_coverage_curve(p: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Coverage k/n and risk (error rate of the k most confident calls), k = 1..n."""
    p, y = check_pair(p, y)
    return np.arange(1, p.size + 1) / p.size, 1.0 - _kept_accuracy(p, y)


def _single_class(y: np.ndarray) -> bool:
    return np.unique(y).size < 2


def aurc(p: ArrayLike, y: ArrayLike) -> float:
    """Area under the risk-coverage curve (lower is better); NaN on a single-class test set."""
    p, y = check_pair(p, y)
    if _single_class(y):
        return float("nan")
    return float(np.mean(1.0 - _kept_accuracy(p, y)))


def prr(p: ArrayLike, y: ArrayLike) -> float:
    """Prediction-rejection ratio (higher is better; formula in the module docstring); NaN on one class."""
    p, y = check_pair(p, y)
    if _single_class(y):
        return float("nan")
    area = np.mean(_kept_accuracy(p, y))
    oracle = np.mean(_kept_accuracy(y.astype(float), y))
    random = y.mean()
    return float((area - random) / (oracle - random))
