"""Per-argument confidence: which part of a generated call the LLM was unsure of.

A call's raw confidence multiplies the probabilities of all its content tokens, so it says *that*
a call may be wrong, not *where*. Here each top-level argument, and the API name, gets four
confidences from the tokens that overlap its span in the generated text:

* ``product``: the product of those tokens' probabilities (the raw confidence of that span);
* ``min_token`` / ``mean_token``: the least likely token's probability, the tokens' geometric mean;
* ``lens``: the logit-lens layers' agreement on the span, the share of (layer, token) pairs
  whose lens already predicts the generated token (MICE's idea that a span the early layers
  already settle on is a safer one), from the records' ``lens_ids`` [L-1, T]. Records files
  written before ``mice-exp records`` kept ``lens_ids`` (the committed ones) give NaN, with that reason.

Each argument of a call to the gold API is labelled right or wrong by the data set's own rule
(:func:`mice_exp.data.labels.argument_labels`: STE's exact value, BFCL's per-parameter checker),
the API name by whether it is the gold API. Pooled over the test calls, that asks whether the
confidences rank and calibrate those errors (AUROC, smECE), and whether the least confident
argument of a call with a wrong one is a wrong one (localization).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mice_exp.data.labels import argument_labels, gold_api
from mice_exp.data.records import Example
from mice_exp.llm.toolcall import REACT, CallFormat, Span, member_spans
from mice_exp.metrics import auroc, smece
from mice_exp.tracking.schema import API_NAME, ARGUMENT, LENS, MEAN_TOKEN, MIN_TOKEN, PRODUCT, span_key


def argument_spans(text: str, fmt: CallFormat = REACT) -> dict[str, Span]:
    """Character span of each top-level argument's value in the call's argument JSON ({} if none parses)."""
    args = fmt.spans(text).args
    if args is None:
        return {}
    try:
        return dict(member_spans(text, args[0]))
    except ValueError:
        return {}


def _tokens(record: Mapping[str, Any], span: Span) -> list[int]:
    """Indices of the generated tokens that overlap ``span``."""
    lo, hi = span
    return [k for k, (start, end) in enumerate(record["offsets"]) if start < hi and end > lo]


def _probs(record: Mapping[str, Any], span: Span) -> np.ndarray:
    """The probabilities of the generated tokens that overlap ``span``."""
    return np.asarray(record["token_probs"], dtype=float)[_tokens(record, span)]


def token_product(record: Mapping[str, Any], span: Span) -> float:
    """Product of the probabilities of the tokens overlapping ``span`` (1.0 for none, an empty product)."""
    return float(np.prod(_probs(record, span)))


def lens_agreement(record: Mapping[str, Any], span: Span) -> float:
    """Share of (layer, token) pairs over ``span``'s tokens whose logit lens predicts the generated
    token; NaN without ``lens_ids`` (a records file), without layers below the last or tokens."""
    lens, tokens = record.get("lens_ids"), _tokens(record, span)
    if not lens or not tokens:
        return math.nan
    lens = np.asarray(lens)[:, tokens]
    return float(np.mean(lens == np.asarray(record["token_ids"])[tokens]))


def least_token(record: Mapping[str, Any], span: Span) -> float:
    """The probability of the least likely token overlapping ``span`` (1.0 for none)."""
    probs = _probs(record, span)
    return float(probs.min()) if len(probs) else 1.0


def mean_token(record: Mapping[str, Any], span: Span) -> float:
    """The geometric mean of the probabilities of the tokens overlapping ``span`` (1.0 for none): the product
    without its length, so a long right value is not less certain than a short wrong one for its length alone."""
    probs = _probs(record, span)
    return float(np.exp(np.mean(np.log(np.maximum(probs, 1e-300))))) if len(probs) else 1.0


#: The confidences of a span, by their name in the metric keys (:data:`mice_exp.tracking.schema.SPAN_CONFIDENCES`).
CONFIDENCES: dict[str, Callable[[Mapping[str, Any], Span], float]] = {
    PRODUCT: token_product, LENS: lens_agreement, MIN_TOKEN: least_token, MEAN_TOKEN: mean_token}


def argument_confidences(record: Mapping[str, Any], confidence: str = PRODUCT,
                         fmt: CallFormat = REACT) -> dict[str, float]:
    """One confidence of each top-level argument of the record's call ({} for an unparseable call)."""
    of = CONFIDENCES[confidence]
    return {name: of(record, span) for name, span in argument_spans(record["text"], fmt).items()}


def api_confidence(record: Mapping[str, Any], confidence: str = PRODUCT, fmt: CallFormat = REACT) -> float:
    """One confidence of the call's API name (NaN when the text names no API)."""
    span = fmt.spans(record["text"]).api
    return math.nan if span is None else CONFIDENCES[confidence](record, span)


def answer_arguments(record: Mapping[str, Any], fmt: CallFormat = REACT,
                     rule: str = PRODUCT) -> tuple[dict[str, float], str | None]:
    """The gate's per-argument answer: ``{name: confidence under rule}`` and None, or ``{}`` and why there is none."""
    if record.get("pred_args") is None:
        return {}, f"no per-argument confidence: the call is unparseable ({record.get('parse_error')})"
    return argument_confidences(record, rule, fmt), None


def localizing_rule(scores: ArgumentScores) -> dict[str, Any]:
    """Which confidence a gate asks the user about (its least confident argument), chosen by what ``scores``
    (:func:`argument_metrics` of the calls it was fitted on) say localises a wrong argument best: ``rule``,
    each rule's ``localization`` and ``calls`` (calls to the gold API with a wrong argument). Ties and no such
    call keep ``product``, the token product every earlier gate used."""
    localization = {c: scores.metrics[span_key(ARGUMENT, "localization", c)] for c in CONFIDENCES}
    known = {c: v for c, v in localization.items() if not math.isnan(v)}
    rule = max(known, key=lambda c: (known[c], c == PRODUCT)) if known else PRODUCT
    return {"rule": rule, "localization": {c: None if math.isnan(v) else v for c, v in localization.items()},
            "calls": scores.localized_calls}


@dataclass
class ArgumentScores:
    """``argument.*`` / ``api_name.*`` metrics (:func:`mice_exp.tracking.schema.span_key`) and, for
    each NaN among them, why it is NaN."""

    metrics: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)
    localized_calls: int = 0  # calls to the gold API with a wrong argument: what localization is measured on

    def summary(self) -> str:
        """What a run prints: one line per span kind, then one per reason a metric is NaN."""
        m = self.metrics
        lines = [f"per-argument confidence on test: {int(m[span_key(ARGUMENT, 'n')])} arguments of calls to the "
                 f"gold API (accuracy {m[span_key(ARGUMENT, 'accuracy')]:.3f}) and "
                 f"{int(m[span_key(API_NAME, 'n')])} API names (accuracy {m[span_key(API_NAME, 'accuracy')]:.3f}); "
                 f"a random argument localizes a wrong one in {m[span_key(ARGUMENT, 'localization_chance')]:.3f}"]
        for span, stats in ((ARGUMENT, ("auroc", "smece", "localization")), (API_NAME, ("auroc", "smece"))):
            for confidence in CONFIDENCES:
                values = ", ".join(f"{s} {m[span_key(span, s, confidence)]:.3f}" for s in stats)
                lines.append(f"  {span} {confidence}: {values}")
        by_reason: dict[str, list[str]] = {}
        for key, reason in self.notes.items():
            by_reason.setdefault(reason, []).append(key)
        lines += [f"  NaN {', '.join(keys)}: {reason}" for reason, keys in by_reason.items()]
        return "\n".join(lines)


def _pooled(scores: Mapping[str, list[float]], right: list[int], span: str, what: str) -> ArgumentScores:
    """n, accuracy and each confidence's AUROC / smECE of one span kind, with the reasons for NaNs."""
    metrics = {span_key(span, "n"): float(len(right)),
               span_key(span, "accuracy"): float(np.mean(right)) if right else math.nan}
    out = ArgumentScores(metrics)
    if not right:
        out.notes[span_key(span, "accuracy")] = f"no {what} on test"
    for confidence, values in scores.items():
        for stat, metric in (("auroc", auroc), ("smece", smece)):
            key = span_key(span, stat, confidence)
            known = [(v, y) for v, y in zip(values, right) if not math.isnan(v)]
            if not right:
                out.notes[key] = f"no {what} on test"
            elif not known:
                out.notes[key] = ("the records keep no lens_ids (a records file written before `mice-exp records` kept "
                                  "them; the LLM-stage cache has them)")
            elif stat == "auroc" and len({y for _, y in known}) < 2:
                out.notes[key] = f"all {what} are {'right' if known[0][1] else 'wrong'}: nothing to rank"
            metrics[key] = math.nan if key in out.notes else metric(*map(list, zip(*known)))
    return out


def argument_metrics(records: Iterable[Mapping[str, Any]], examples: Mapping[str, Example],
                     fmt: CallFormat = REACT) -> ArgumentScores:
    """Pooled per-argument and API-name scores of ``records`` whose example (by id) has a gold API; ``fmt``:
    the format the records' replies are in (``prompt.format``).

    ``argument.*``: the arguments of parsed calls to the gold API, labelled by
    :func:`argument_labels`; ``*.localization``: share of those calls with a wrong argument whose
    least confident argument is a wrong one, ``argument.localization_chance``: the same for an
    argument picked at random. ``api_name.*``: every call with an API name.
    """
    arg_scores: dict[str, list[float]] = {c: [] for c in CONFIDENCES}
    api_scores: dict[str, list[float]] = {c: [] for c in CONFIDENCES}
    arg_right, api_right, localized, chance = [], [], {c: [] for c in CONFIDENCES}, []
    for record in records:
        example = examples.get(record["id"])
        if example is None or gold_api(example) is None or record.get("pred_api") is None:
            continue
        api_right.append(int(record["pred_api"] == gold_api(example)))
        for c in CONFIDENCES:
            api_scores[c].append(api_confidence(record, c, fmt))
        args = record.get("pred_args")
        if not api_right[-1] or not isinstance(args, dict):
            continue
        per_confidence = {c: argument_confidences(record, c, fmt) for c in CONFIDENCES}
        right = {name: int(ok) for name, ok in argument_labels(example, args).items() if name in per_confidence[PRODUCT]}
        arg_right += right.values()
        if right and not all(right.values()):
            chance.append(1 - float(np.mean(list(right.values()))))
        for c, scores in per_confidence.items():
            arg_scores[c] += [scores[name] for name in right]
            if right and not all(right.values()) and not any(math.isnan(scores[n]) for n in right):
                localized[c].append(1 - right[min(right, key=scores.__getitem__)])
    out = _pooled(arg_scores, arg_right, ARGUMENT, "arguments of calls to the gold API")
    for c, hits in localized.items():
        key = span_key(ARGUMENT, "localization", c)
        out.metrics[key] = float(np.mean(hits)) if hits else math.nan
        if not hits:
            out.notes[key] = out.notes.get(span_key(ARGUMENT, "auroc", c), "no call to the gold API with a wrong argument")
    key = span_key(ARGUMENT, "localization_chance")
    out.metrics[key] = float(np.mean(chance)) if chance else math.nan
    if not chance:
        out.notes[key] = "no call to the gold API with a wrong argument"
    api = _pooled(api_scores, api_right, API_NAME, "API names")
    return ArgumentScores(out.metrics | api.metrics, out.notes | api.notes, len(chance))
