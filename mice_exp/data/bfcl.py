"""Load BFCL's single-call categories from the installed ``bfcl-eval`` package's data.

Each category file is JSON lines: ``{"id", "question": [[{"role", "content"}, ...]],
"function": [schema, ...]}``, and ``possible_answer/<same name>`` holds ``{"id",
"ground_truth": [{name: {param: [acceptable values]}}]}``. bfcl_eval itself is never
imported: its dependencies are not installed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mice_exp.data.bfcl_checker import NESTED_TYPES
from mice_exp.data.records import Example, format_demo
from mice_exp.errors import UserError
from mice_exp.packages import package_dir

# Categories with one expected call, checked by BFCL's Python AST rules.
CATEGORIES = ("simple_python", "multiple", "live_simple", "live_multiple")
FILE_PREFIX = "BFCL_v4_"


def bfcl_data_dir() -> Path:
    """The ``data`` folder of the installed bfcl-eval package."""
    return package_dir("bfcl_eval", "bfcl-eval", "the BFCL data") / "data"


def load_bfcl(categories: Sequence[str]) -> list[Example]:
    """Examples of ``categories`` in the given order, each in file order.

    ``api`` is the category. The query joins the turn's messages (a system message
    first, where BFCL gives one, as it carries facts the call needs). An entry whose gold
    can never be met under BFCL's rules is left out: a gold parameter the function does
    not declare, or one with no acceptable value (four in BFCL v4: live_simple 106 and
    112, live_multiple 862 and 964).
    """
    if isinstance(categories, str) or not categories:
        raise UserError(f"dataset.categories={categories!r}: expected a non-empty list of {list(CATEGORIES)}")
    for category in categories:
        if category not in CATEGORIES:
            raise UserError(f"dataset.categories: unknown category {category!r}; expected some of {list(CATEGORIES)}")
    if len(set(categories)) != len(categories):
        raise UserError(f"dataset.categories={list(categories)!r} lists a category twice")
    folder = bfcl_data_dir()
    examples = []
    for category in categories:
        questions = _read_json_lines(folder / f"{FILE_PREFIX}{category}.json")
        answer_file = folder / "possible_answer" / f"{FILE_PREFIX}{category}.json"
        answers = {a["id"]: a["ground_truth"] for a in _read_json_lines(answer_file)}
        for index, entry in enumerate(questions):
            example = _example(category, index, entry, answers[entry["id"]])
            if example is not None:
                examples.append(example)
    return examples


def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    """Parse a BFCL JSON-lines file, naming the file and line on failure."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UserError(f"cannot read BFCL file {path} ({error}); reinstall bfcl-eval with `make run`") from error
    try:
        return [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: line {error.lineno} is not valid JSON ({error.msg})") from error


def _example(category: str, index: int, entry: dict[str, Any], ground_truth: list[dict[str, Any]]) -> Example | None:
    """One Example, or None when the gold can never be met (see :func:`load_bfcl`)."""
    ((name, possible),) = ground_truth[0].items()  # these categories expect exactly one call
    functions = entry["function"]
    (function,) = [f for f in functions if f["name"] == name]
    parameters = function["parameters"]
    if any(param not in parameters["properties"] or not values for param, values in possible.items()):
        return None
    return Example(
        id=f"bfcl/{category}/{index}",
        dataset="bfcl",
        api=category,
        query="\n\n".join(message["content"].strip() for message in entry["question"][0]),
        tools=json.dumps(functions, indent=4, ensure_ascii=False),
        tool_names=tuple(f["name"] for f in functions),
        gold={"name": name, "parameters": parameters, "possible_answer": possible},
        demo=format_demo(name, canonical_arguments(parameters, possible)),
    )


def canonical_arguments(parameters: dict[str, Any], possible: dict[str, list[Any]]) -> dict[str, Any]:
    """One accepted argument dict: what may be omitted is omitted, else the first value.

    A parameter is omitted when ``""`` is acceptable and the schema does not require
    it; nested dict candidates are reduced the same way, key by key.
    """
    required = set(parameters.get("required", []))
    arguments = {}
    for param, values in possible.items():
        if "" in values and param not in required:
            continue
        spec = parameters["properties"][param]
        value = _first_value(values)
        if spec["type"] == "dict" and isinstance(value, dict):
            value = _canonical_dict(value)
        elif spec["type"] in NESTED_TYPES and spec["items"]["type"] == "dict" and isinstance(value, list):
            value = [_canonical_dict(item) for item in value]
        arguments[param] = value
    return arguments


def _first_value(values: list[Any]) -> Any:
    """The first candidate that is not the optional marker (``""`` if that is all)."""
    return next((v for v in values if v != ""), "")


def _canonical_dict(candidate: dict[str, list[Any]]) -> dict[str, Any]:
    """A dict candidate (key -> acceptable values) reduced to one accepted dict."""
    return {key: _first_value(values) for key, values in candidate.items() if "" not in values}
