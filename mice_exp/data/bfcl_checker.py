"""BFCL's AST checker for one Python call, reimplemented so labels need no bfcl_eval deps.

Mirrors ``bfcl_eval/eval_checker/ast_eval/ast_checker.py`` (``simple_function_checker``
with ``Language.PYTHON``, which BFCL uses for simple_python, multiple, live_simple and
live_multiple). The rules, in BFCL's order:

* the function name must equal the gold name;
* every parameter the schema marks required must be present;
* every given parameter must be in the schema *and* in the possible answer;
* an int is accepted where the schema says float (top level only, as in BFCL);
* the value's Python type must be the schema type (``array``/``tuple`` -> list,
  ``dict`` -> dict, ``any`` -> str; bool is not int), with array items checked one
  level deep; a value whose type is that of the possible answers instead counts as a
  "variable" and is compared as is;
* strings are compared after BFCL's standardisation (drop spaces and ``,./-_*^``,
  lowercase, ``'`` -> ``"``); lists element-wise with their strings standardised;
  dicts key by key against each candidate dict (keys whose candidates include ``""``
  may be missing); lists of dicts position by position; anything else by ``in``;
* a possible-answer parameter may be omitted only if ``""`` is among its values.

``""`` inside a list-valued parameter's candidates stands for the empty list, as it
does in BFCL (it iterates over the empty string).
"""

from __future__ import annotations

import re
from typing import Any

PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
NESTED_TYPES = ("array", "tuple")
_PUNCTUATION = re.compile(r"[ \,\.\/\-\_\*\^]")


def standardize_string(text: str) -> str:
    """BFCL's string normalisation, so 'April 1, 2024' matches 'april 1 2024'."""
    return _PUNCTUATION.sub("", text).lower().replace("'", '"')


def check_call(gold: dict[str, Any], api: str, args: dict[str, Any]) -> bool:
    """Whether ``api(**args)`` is accepted for a gold built by :mod:`mice_exp.data.bfcl`.

    ``gold`` holds ``name``, ``parameters`` (the function's JSON schema) and
    ``possible_answer`` (parameter -> list of acceptable values).
    """
    if api != gold["name"]:
        return False
    if any(param not in args for param in gold["parameters"].get("required", [])):
        return False
    if not all(check_argument(gold, param, value) for param, value in args.items()):
        return False
    return all(param in args or "" in values for param, values in gold["possible_answer"].items())


def check_argument(gold: dict[str, Any], param: str, value: Any) -> bool:
    """Whether one given argument ``param=value`` of a call to the gold function passes BFCL's
    per-parameter rules: declared in the schema and the possible answer, right type, accepted value.

    A call is accepted iff every given argument passes and none required or expected is missing
    (:func:`check_call`); this is the per-argument label of :mod:`mice_exp.features.arguments`.
    """
    schema, possible = gold["parameters"]["properties"], gold["possible_answer"]
    return param in schema and param in possible and _param_ok(value, schema[param], possible[param])


def _param_ok(value: Any, spec: dict[str, Any], acceptable: list[Any]) -> bool:
    """Type check, then value check, of one top-level argument."""
    type_name = spec["type"]
    expected = PYTHON_TYPES[type_name]
    nested = PYTHON_TYPES[spec["items"]["type"]] if type_name in NESTED_TYPES else None
    if type_name == "float" and type(value) is int:
        value = float(value)
    valid, is_variable = _type_ok(value, acceptable, expected, nested)
    if not valid:
        return False
    if not is_variable:
        if expected is dict:
            return _dict_ok(value, acceptable)
        if expected is list and nested is dict:
            return _list_of_dicts_ok(value, acceptable)
        if expected is str:
            return standardize_string(value) in [standardize_string(c) for c in acceptable if type(c) is str]
        if expected is list:
            candidates = [[] if c == "" else _standardize_list(c) for c in acceptable if c == "" or type(c) is list]
            return _standardize_list(value) in candidates
    return value in acceptable


def _answer_type(acceptable: list[Any]) -> type | None:
    """Type of the first non-optional candidate; None if all candidates are ``""``."""
    return next((type(c) for c in acceptable if c != ""), None)


def _type_ok(value: Any, acceptable: list[Any], expected: type, nested: type | None) -> tuple[bool, bool]:
    """BFCL's ``type_checker``: (valid, is_variable)."""
    answer_type = _answer_type(acceptable)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for candidate in acceptable:
            if type(candidate) is not list or all(
                _type_ok(item, candidate, nested, None)[0] for item in value
            ):
                return True, is_variable
        return False, False
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, False


def _standardize_list(values: list[Any]) -> list[Any]:
    """A list with its string elements standardised."""
    return [standardize_string(v) if type(v) is str else v for v in values]


def _standardize(value: Any) -> Any:
    """Standardise strings, leave other values as they are."""
    return standardize_string(value) if type(value) is str else value


def _dict_ok(value: dict[str, Any], candidates: list[Any]) -> bool:
    """BFCL's ``dict_checker``: the value must fit at least one candidate dict."""
    for candidate in candidates:
        if type(candidate) is not dict:  # "" (optional) or a variable: nothing to match
            continue
        keys_ok = all(
            key in candidate and _standardize(item) in [_standardize(c) for c in candidate[key]]
            for key, item in value.items()
        )
        if keys_ok and all(key in value or "" in options for key, options in candidate.items()):
            return True
    return False


def _list_of_dicts_ok(value: list[Any], candidates: list[Any]) -> bool:
    """BFCL's ``list_dict_checker``: same length and each dict fits its counterpart."""
    lists = [[] if c == "" else c for c in candidates if c == "" or type(c) is list]
    return any(
        len(value) == len(candidate)
        and all(type(item) is dict and _dict_ok(item, [expected]) for item, expected in zip(value, candidate))
        for candidate in lists
    )
