"""Per-argument confidence: which argument of a generated call the LLM was unsure of.

A call's raw confidence multiplies the probabilities of all its content tokens, so it says *that*
a call may be wrong, not *where*. Here each top-level argument gets the product of the
probabilities of the tokens that overlap its value in the argument JSON, and each argument of a
call to the gold API is labelled by whether its value equals the gold's. Pooled over the test
calls, that asks whether argument confidences rank and calibrate argument errors (AUROC, smECE),
and whether the least confident argument of a wrong call is a wrong one (localization).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from mice_exp.data.labels import json_equal
from mice_exp.llm.toolcall import find_spans
from mice_exp.metrics import auroc, smece

_DECODER = json.JSONDecoder()


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def argument_spans(text: str) -> dict[str, tuple[int, int]]:
    """Character span of each top-level argument's value in the call's argument JSON ({} if none parses)."""
    args = find_spans(text).args
    if args is None:
        return {}
    spans, i = {}, _skip_space(text, args[0] + 1)
    try:
        while i < args[1] and text[i] != "}":
            key, i = _DECODER.raw_decode(text, i)
            i = _skip_space(text, i)
            if text[i] != ":":
                return {}
            start = _skip_space(text, i + 1)
            _, end = _DECODER.raw_decode(text, start)
            spans[str(key)] = (start, end)
            i = _skip_space(text, end)
            i = _skip_space(text, i + 1) if text[i] == "," else i
    except (json.JSONDecodeError, IndexError):
        return {}
    return spans


def argument_confidences(record: Mapping[str, Any]) -> dict[str, float]:
    """Product of the probabilities of the tokens overlapping each argument's value."""
    probs = np.asarray(record["token_probs"], dtype=float)
    offsets = record["offsets"]
    out = {}
    for name, (lo, hi) in argument_spans(record["text"]).items():
        overlap = [k for k, (start, end) in enumerate(offsets) if start < hi and end > lo]
        out[name] = float(np.prod(probs[overlap])) if overlap else 1.0
    return out


def argument_metrics(records: Iterable[Mapping[str, Any]], gold: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """``argument.*`` scores over the arguments of calls to the gold API (gold: id -> {action, action_input}).

    n: arguments scored; accuracy: share equal to the gold value; auroc, smece: of the argument
    confidences against that (NaN with one class or none); localization: share of the calls with a wrong
    argument value whose least confident argument is a wrong one (NaN without such calls).
    """
    confidences, correct, localized = [], [], []
    for record in records:
        call = gold.get(record["id"])
        args = record.get("pred_args")
        if call is None or not isinstance(args, dict) or record.get("pred_api") != call["action"]:
            continue
        scores = argument_confidences(record)
        right = {name: int(name in call["action_input"] and json_equal(value, call["action_input"][name]))
                 for name, value in args.items() if name in scores}
        confidences += [scores[name] for name in right]
        correct += list(right.values())
        if right and not all(right.values()):
            localized.append(1 - right[min(right, key=scores.__getitem__)])
    nan = float("nan")
    two_classes = len(set(correct)) == 2
    return {"argument.n": float(len(correct)),
            "argument.accuracy": float(np.mean(correct)) if correct else nan,
            "argument.auroc": auroc(confidences, correct) if two_classes else nan,
            "argument.smece": smece(confidences, correct) if correct else nan,
            "argument.localization": float(np.mean(localized)) if localized else nan}
