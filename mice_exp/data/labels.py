"""Whether a generated call is correct: the training target of every estimator.

Each example carries its data set's rule (:attr:`Example.labels`, a :class:`~mice_exp.data.records.Labels`);
the functions here ask it, so a stage labels any data set's examples the same way. :class:`ExactMatch` is the
MICE paper's rule, which STE and jsonl use.
"""

from __future__ import annotations

from typing import Any

from mice_exp.data.records import Example, Labels


def is_correct(example: Example, api: str | None, args: dict[str, Any] | None) -> bool:
    """Label one generated call; ``None`` (an unparseable generation) is never correct, except where no call is
    the right answer (the data set's rule decides)."""
    return example.labels.is_correct(example, api, args)


def argument_labels(example: Example, args: dict[str, Any]) -> dict[str, bool]:
    """Whether each given argument of a call to the gold API is right, by the rule of :func:`is_correct`.
    Arguments the call leaves out have no span, so no label; nor has any argument where there is no gold call:
    ``{}``."""
    return example.labels.argument_labels(example, args)


def gold_api(example: Example) -> str | None:
    """The API the gold call names (None for a query without gold, as the gate's, or without a gold call, as
    BFCL's relevance categories)."""
    return example.labels.gold_api(example)


def call_expected(example: Example) -> bool | None:
    """Where the label asks only whether a call is made (BFCL's relevance categories), whether one is
    expected; None where a gold call is checked."""
    return example.labels.call_expected(example)


def made_call(api: str | None, args: dict[str, Any] | None) -> bool:
    """Whether a generation holds a call: a parsed name with parsed arguments (BFCL's "contains a function
    call"; an unparseable reply is no call)."""
    return api is not None and args is not None


class ExactMatch(Labels):
    """The MICE paper's rule: the call must exactly match the gold ``{"action", "action_input"}``, i.e. the same
    API and the same parsed arguments (:func:`json_equal`); an argument is right iff its value equals the gold's."""

    def is_correct(self, example: Example, api: str | None, args: dict[str, Any] | None) -> bool:
        return made_call(api, args) and api == example.gold["action"] and json_equal(args, example.gold["action_input"])

    def argument_labels(self, example: Example, args: dict[str, Any]) -> dict[str, bool]:
        gold = example.gold["action_input"]
        return {name: name in gold and json_equal(value, gold[name]) for name, value in args.items()}

    def gold_api(self, example: Example) -> str | None:
        return example.gold.get("action")


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


#: The exact-match rule, for examples loaded outside a :class:`~mice_exp.data.dataset.Dataset` (a loader called alone).
EXACT_MATCH = ExactMatch()
