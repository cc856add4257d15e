"""Multiple-choice scoring as lm-eval-harness does it, and When2Call's metrics on the chosen answers.

lm-eval-harness (``lm_eval/api/task.py``, ``process_results`` of ``output_type: multiple_choice``) picks
``argmax(lls)`` for ``acc`` (each choice's summed token log-likelihood) and ``argmax(lls / len(choice))`` for
``acc_norm`` (divided by the choice's length in characters); ``prob_norm = softmax(lls)`` is the probability its
Brier score reads. When2Call's task (NVIDIA/When2Call, ``evaluation/mcq/lm_eval_harness/when2call``) reports
``acc``, ``acc_norm`` and ``macro_f1``, a per-item ``(gold, pred)`` pair (as lm-eval's ``f1`` is, whose ``pred``
is the unnormalised argmax) aggregated by a fork of the harness that is not public; its
``additional_metrics.py`` defines the tool-hallucination rate on those pairs (:func:`hallucination_rate`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike

#: How the choices' log-likelihoods are compared: summed (lm-eval's ``acc``) or per character (``acc_norm``).
NORMALISATIONS = ("sum", "chars")


def choice_scores(loglik: ArrayLike, chars: ArrayLike, normalisation: str) -> np.ndarray:
    """[N, K] scores whose argmax is the chosen answer: the log-likelihoods as they are (``sum``) or divided by
    each choice's length in characters (``chars``)."""
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation={normalisation!r}; expected one of {', '.join(NORMALISATIONS)}")
    ll = np.asarray(loglik, dtype=float)
    return ll if normalisation == "sum" else ll / np.asarray(chars, dtype=float)


def choice_probability(loglik: ArrayLike, column: int) -> np.ndarray:
    """[N]: lm-eval's ``prob_norm`` (softmax of the summed log-likelihoods over the K choices) of one choice."""
    ll = np.asarray(loglik, dtype=float)
    shifted = np.exp(ll - ll.max(axis=1, keepdims=True))
    return shifted[:, column] / shifted.sum(axis=1)


def margin(scores: ArrayLike, column: int) -> np.ndarray:
    """[N]: one choice's score minus the best other choice's (> 0 where it is chosen)."""
    s = np.asarray(scores, dtype=float)
    others = np.delete(s, column, axis=1)
    return s[:, column] - others.max(axis=1)


def class_f1(gold: Sequence[str], pred: Sequence[str]) -> dict[str, float]:
    """F1 of each class in ``gold`` or ``pred`` (sorted), scikit-learn's ``f1_score(average=None)`` over those
    labels: a class never predicted nor true is absent, one predicted but never true scores 0."""
    from sklearn.metrics import f1_score

    labels = sorted(set(map(str, gold)) | set(map(str, pred)))
    scores = f1_score([str(g) for g in gold], [str(p) for p in pred], labels=labels, average=None, zero_division=0)
    return {label: float(score) for label, score in zip(labels, scores)}


def macro_f1(gold: Sequence[str], pred: Sequence[str]) -> float:
    """The mean of :func:`class_f1` (scikit-learn's ``average="macro"``: a predicted class with no true item
    counts, with F1 0, as When2Call's ``direct`` answer does on its LLM-judge set, where no item's answer is it)."""
    return float(np.mean(list(class_f1(gold, pred).values())))


def hallucination_rate(gold: Sequence[str], pred: Sequence[str], n_tools: Sequence[int]) -> float:
    """When2Call's tool-hallucination rate (``additional_metrics.py``): of the items whose right answer is
    ``cannot_answer`` and that offer no tool, the share where ``tool_call`` is chosen; NaN with no such item."""
    g, p, n = np.asarray(gold), np.asarray(pred), np.asarray(n_tools)
    eligible = (g == "cannot_answer") & (n == 0)
    return float(np.mean(p[eligible] == "tool_call")) if eligible.any() else float("nan")
