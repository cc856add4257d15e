"""Whether a generated tool call is correct: the training target of every estimator."""

from __future__ import annotations

from typing import Any

from mice_exp.data.bfcl_checker import check_argument, check_call
from mice_exp.data.records import Example


def is_correct(example: Example, api: str | None, args: dict[str, Any] | None) -> bool:
    """Label one generated call; ``None`` (an unparseable generation) is never correct, except
    where no call is the right answer.

    STE and jsonl follow the MICE paper: the call must exactly match the gold, i.e. the
    same API and the same parsed arguments (see :func:`json_equal`). BFCL uses its own
    possible-answer rules (:mod:`mice_exp.data.bfcl_checker`); its relevance categories
    (gold ``{"call_expected": bool}``) ask only whether a call parsed, whatever its name and
    arguments: irrelevance is right iff none did, live_relevance iff one did (BFCL's
    ``relevance_file_runner``, see :mod:`mice_exp.data.bfcl`).
    """
    called = made_call(api, args)
    if (expected := call_expected(example)) is not None:
        return called == expected
    if not called:
        return False
    if example.dataset == "bfcl":
        return check_call(example.gold, api, args)
    if example.dataset in ("ste", "jsonl"):
        return api == example.gold["action"] and json_equal(args, example.gold["action_input"])
    raise ValueError(f"no labeler for dataset {example.dataset!r} (example {example.id})")


def made_call(api: str | None, args: dict[str, Any] | None) -> bool:
    """Whether a generation holds a call: a parsed name with parsed arguments (BFCL's "contains a function
    call"; an unparseable reply is no call)."""
    return api is not None and args is not None


def call_expected(example: Example) -> bool | None:
    """Where the label asks only whether a call is made (BFCL's relevance categories), whether one is
    expected; None where a gold call is checked."""
    return example.gold.get("call_expected") if example.dataset == "bfcl" else None


def gold_api(example: Example) -> str | None:
    """The API the gold call names (None for a query without gold, as the gate's, or without a gold
    call, as BFCL's relevance categories)."""
    return example.gold.get("name" if example.dataset == "bfcl" else "action")


def argument_labels(example: Example, args: dict[str, Any]) -> dict[str, bool]:
    """Whether each given argument of a call to the gold API is right, by the same rule as
    :func:`is_correct`: STE and jsonl, the value equals the gold's; BFCL, the argument passes the
    checker's per-parameter rules. Arguments the call leaves out have no span, so no label; nor
    has any argument where there is no gold call (BFCL's relevance categories): ``{}``.
    """
    if call_expected(example) is not None:
        return {}
    if example.dataset == "bfcl":
        return {name: check_argument(example.gold, name, value) for name, value in args.items()}
    if example.dataset in ("ste", "jsonl"):
        gold = example.gold["action_input"]
        return {name: name in gold and json_equal(value, gold[name]) for name, value in args.items()}
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
