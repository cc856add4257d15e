"""Load BFCL's single-call and relevance categories from the installed ``bfcl-eval`` package's data.

Each category file is JSON lines: ``{"id", "question": [[{"role", "content"}, ...]],
"function": [schema, ...]}``. For the single-call categories (:data:`CALL_CATEGORIES`),
``possible_answer/<same name>`` holds ``{"id", "ground_truth": [{name: {param: [acceptable
values]}}]}``. The relevance categories (:data:`RELEVANCE_CATEGORIES`) have no possible-answer
file: BFCL asks only whether the reply makes a call at all. bfcl_eval itself is never imported:
its dependencies are not installed.

How BFCL scores the relevance categories (bfcl-eval 2026.3.23): ``evaluate_task`` in
``bfcl_eval/eval_checker/eval_runner.py`` sends every category for which
``bfcl_eval/utils.py: is_relevance_or_irrelevance`` holds to ``relevance_file_runner``, without
loading a possible answer. Its ``_evaluate_single_relevance_entry`` decodes the reply with the
handler's ``decode_ast`` (prompting models: ``bfcl_eval/model_handler/utils.py:
default_decode_ast_prompting``); the reply "contains a function call" iff that decoding succeeds
and ``is_empty_output`` (``bfcl_eval/utils.py``) is false, i.e. it gives a non-empty list of
``{name: {args}}`` (a call without arguments counts; ``[]`` and ``[{}]`` do not). ``irrelevance``
and ``live_irrelevance`` pass iff the reply contains no call; ``live_relevance`` passes iff it
contains one. Neither the function name nor the arguments are checked: any call, even to a
function the entry does not offer, passes live_relevance and fails the irrelevance categories.
Here a reply's call is what the prompt's reply format parses (:mod:`mice_exp.llm.toolcall`, e.g. an
``Action:`` name and a JSON object after ``Action Input:``); a reply it cannot parse has no call, as a
reply BFCL's decoder rejects has none (:func:`mice_exp.data.labels.is_correct`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mice_exp.data.bfcl_checker import NESTED_TYPES, check_argument, check_call
from mice_exp.data.dataset import Dataset
from mice_exp.data.labels import made_call
from mice_exp.data.records import Example, Labels, format_demo
from mice_exp.errors import UserError
from mice_exp.packages import package_dir
from mice_exp.paths import Paths

# Categories with one expected call, checked by BFCL's Python AST rules.
CALL_CATEGORIES = ("simple_python", "multiple", "live_simple", "live_multiple")
# Categories that ask whether to call at all: category -> whether a call is expected.
RELEVANCE_CATEGORIES = {"irrelevance": False, "live_irrelevance": False, "live_relevance": True}
CATEGORIES = CALL_CATEGORIES + tuple(RELEVANCE_CATEGORIES)
FILE_PREFIX = "BFCL_v4_"
#: The demonstration of a query no tool fits (irrelevance, live_irrelevance): a reply with no call,
#: saying so, as BFCL's prompt asks ("If none of the functions can be used, point it out").
NO_CALL_DEMO = "None of the given tools can answer this query, so no tool is called."
#: The demo of a live_relevance query: none. BFCL accepts any call there and gives no gold call, so
#: there is no right reply to show; ``demo == ""`` keeps the example out of the demonstration pool
#: (:func:`mice_exp.data.demo_pool`), as a gate's queries are.
NO_DEMO = ""


class BfclAst(Labels):
    """BFCL's own rules: the single-call categories by its Python AST checker (:mod:`mice_exp.data.bfcl_checker`),
    the relevance categories (gold ``{"call_expected": bool}``) only by whether a call parsed, whatever its name
    and arguments: irrelevance is right iff none did, live_relevance iff one did (the module docstring)."""

    def is_correct(self, example: Example, api: str | None, args: dict[str, Any] | None) -> bool:
        called = made_call(api, args)
        if (expected := self.call_expected(example)) is not None:
            return called == expected
        return called and check_call(example.gold, api, args)

    def argument_labels(self, example: Example, args: dict[str, Any]) -> dict[str, bool]:
        """Each argument by the checker's per-parameter rules; none where there is no gold call."""
        if self.call_expected(example) is not None:
            return {}
        return {name: check_argument(example.gold, name, value) for name, value in args.items()}

    def gold_api(self, example: Example) -> str | None:
        return example.gold.get("name")

    def call_expected(self, example: Example) -> bool | None:
        return example.gold.get("call_expected")


#: BFCL's rules, for examples loaded outside a :class:`Bfcl` data set (:func:`load_bfcl` called alone).
BFCL_AST = BfclAst()


class Bfcl(BfclAst, Dataset):
    """BFCL's single-call and relevance categories (``conf/dataset/bfcl.yaml``, ``bfcl_relevance.yaml``); each
    category is one "API", the stratum for splits and leave-one-API-out."""

    name = "bfcl"

    def __init__(self, categories: Sequence[str], **common: Any) -> None:
        super().__init__(**common)
        self.categories = check_categories(categories)

    def load(self, paths: Paths) -> list[Example]:
        return load_bfcl(self.categories, self)

    def source(self) -> str:
        return f"dataset.categories={self.categories}"


def check_categories(categories: Any) -> list[str]:
    """``dataset.categories``: a non-empty list of distinct :data:`CATEGORIES`, checked before anything loads."""
    if isinstance(categories, str) or not isinstance(categories, Sequence) or not categories:
        raise UserError(f"dataset.categories={categories!r}: expected a non-empty list of {list(CATEGORIES)}")
    for category in categories:
        if category not in CATEGORIES:
            raise UserError(f"dataset.categories: unknown category {category!r}; expected some of {list(CATEGORIES)}")
    if len(set(categories)) != len(categories):
        raise UserError(f"dataset.categories={list(categories)!r} lists a category twice")
    return list(categories)


def bfcl_data_dir() -> Path:
    """The ``data`` folder of the installed bfcl-eval package."""
    return package_dir("bfcl_eval", "bfcl-eval", "the BFCL data") / "data"


def load_bfcl(categories: Sequence[str], labels: Labels = BFCL_AST) -> list[Example]:
    """Examples of ``categories`` in the given order, each in file order.

    ``api`` is the category. The query joins the turn's messages (a system message
    first, where BFCL gives one, as it carries facts the call needs). Left out:

    * an entry whose gold can never be met under BFCL's rules: a gold parameter the
      function does not declare, or one with no acceptable value (four in BFCL v4:
      live_simple 106 and 112, live_multiple 862 and 964);
    * a live_irrelevance entry whose question holds an earlier assistant message (eight:
      125, 132, 292, 296, 298, 547, 549 and 553, e.g. "Book me a ticket ...", the
      assistant's refusal, "... usiong tools"): a prompt here has one user query per
      example, and joining the turns would show the assistant's words as the user's.

    The relevance categories' gold is ``{"call_expected": bool}`` (see the module
    docstring); the four live_irrelevance entries that offer no function at all (120-123)
    are kept, as in BFCL: their tools read ``[]`` and any call is wrong.
    """
    categories = check_categories(categories)
    folder = bfcl_data_dir()
    examples = []
    for category in categories:
        questions = _read_json_lines(folder / f"{FILE_PREFIX}{category}.json")
        if category in RELEVANCE_CATEGORIES:  # no possible-answer file
            made = (_relevance_example(category, index, entry, labels) for index, entry in enumerate(questions))
        else:
            answer_file = folder / "possible_answer" / f"{FILE_PREFIX}{category}.json"
            answers = {a["id"]: a["ground_truth"] for a in _read_json_lines(answer_file)}
            made = (_example(category, index, entry, answers[entry["id"]], labels)
                    for index, entry in enumerate(questions))
        examples += [example for example in made if example is not None]
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


def _example(category: str, index: int, entry: dict[str, Any], ground_truth: list[dict[str, Any]],
             labels: Labels) -> Example | None:
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
        labels=labels,
    )


def _relevance_example(category: str, index: int, entry: dict[str, Any], labels: Labels) -> Example | None:
    """One Example of a relevance category, or None when its question holds an assistant message."""
    (turn,) = entry["question"]  # these categories are single-turn
    if any(message["role"] == "assistant" for message in turn):
        return None
    functions = entry["function"]
    call_expected = RELEVANCE_CATEGORIES[category]
    return Example(
        id=f"bfcl/{category}/{index}",
        dataset="bfcl",
        api=category,
        query="\n\n".join(message["content"].strip() for message in turn),
        tools=json.dumps(functions, indent=4, ensure_ascii=False),
        tool_names=tuple(f["name"] for f in functions),
        gold={"call_expected": call_expected},
        demo=NO_DEMO if call_expected else NO_CALL_DEMO,
        labels=labels,
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
