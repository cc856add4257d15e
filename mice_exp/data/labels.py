"""Whether a generated tool call is correct: the training target of every estimator."""

from __future__ import annotations

from typing import Any

from mice_exp.data.bfcl_checker import check_call
from mice_exp.data.records import Example


def is_correct(example: Example, api: str | None, args: dict[str, Any] | None) -> bool:
    """Label one generated call; ``None`` (an unparseable generation) is never correct.

    STE and jsonl follow the MICE paper: the call must exactly match the gold, i.e. the
    same API and the same parsed arguments (see :func:`json_equal`). BFCL uses its own
    possible-answer rules (:mod:`mice_exp.data.bfcl_checker`).
    """
    if api is None or args is None:
        return False
    if example.dataset == "bfcl":
        return check_call(example.gold, api, args)
    if example.dataset in ("ste", "jsonl"):
        return api == example.gold["action"] and json_equal(args, example.gold["action_input"])
    raise ValueError(f"no labeler for dataset {example.dataset!r} (example {example.id})")


def json_equal(a: Any, b: Any) -> bool:
    """Equality of parsed JSON values, stricter than Python's ``==``.

    Key order and whitespace do not matter (they are gone after parsing), but types do:
    ``"5" != 5`` and ``true != 1``. Numbers compare by value, so ``5 == 5.0``, as JSON
    itself does not tell integers from floats.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b
    return type(a) is type(b) and a == b
