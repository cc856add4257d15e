"""BFCL v4 multi-turn, one example per step, from the installed ``bfcl-eval`` package (data and backends).

A conversation (``BFCL_v4_multi_turn_<category>.json``: ``question`` = one list of user messages per turn,
``initial_config`` and ``involved_classes`` = the state of its simulated APIs; ``possible_answer/``: the gold
calls of each turn as Python call strings) becomes one example per gold call: the step's prompt shows every
earlier turn (user text, the gold calls, their results) and the step's own turn up to that call; the example's
target is that call. The gold calls are executed in ``bfcl-eval``'s own backend classes (its file system, math,
messaging, posting, ticket, trading, travel and vehicle APIs), loaded with the conversation's ``initial_config``
as its multi-turn runner loads them, and their results are what the history shows. The tools offered are the
involved classes' function docs (``multi_turn_func_doc``), less those ``miss_func`` holds out until their turn,
as BFCL's ``populate_test_cases_with_predefined_functions`` and its inference loop do (``excluded_function`` is
read by no bfcl-eval code, so neither here). A turn whose gold is empty (``miss_func``'s turn asking for a
function not yet offered, ``miss_param``'s turn lacking an argument) is one step where no call is right; BFCL's
``multi_turn_irrelevance_checker`` labels it so. The missing function's turn shows BFCL's own user message
(``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``).

Labels (:class:`MultiTurnLabels`): BFCL's multi-turn checker compares, after each turn, the state of the model's
backend instances with the ground truth's (``state_checker``) and requires the gold calls' results among the
model's (``response_checker``). Per step the same two checks run on one call: the model's call and the gold call
each executed in fresh backends after the gold history; the call is right iff the states then agree and the gold
call's result equals the model call's. A call the backends cannot run (an unknown function, a bad argument) gives
BFCL's ``Error during execution: ...`` result, as in BFCL.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import itertools
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
from bfcl_eval.constants.executable_backend_config import (CLASS_FILE_PATH_MAPPING, MULTI_TURN_FUNC_DOC_FILE_MAPPING,
                                                           STATELESS_CLASSES)
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (multi_turn_checker, response_checker,
                                                                       state_checker)

from mice_exp.data.bfcl import bfcl_data_dir
from mice_exp.data.dataset import Dataset
from mice_exp.data.labels import json_equal, made_call
from mice_exp.data.records import Conversation, Example, Labels, Turn, format_demo
from mice_exp.errors import UserError
from mice_exp.paths import Paths

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
#: BFCL's reply where no call is right (its prompting instructions: "If none of the functions can be used, point
#: it out"; a missing argument: ask for it).
NO_CALL_DEMO = "None of the given functions can do this yet, or an argument is missing; no function is called."
#: Calls BFCL's executor refuses to run (multi_turn_utils.execute_multi_turn_func_call).
FORBIDDEN = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")


class MultiTurnLabels(Labels):
    """BFCL's multi-turn checks on one step (module docstring). ``gold``: ``{"entry", "history", "call"}``, the
    conversation's entry (initial config, classes, category), the gold calls before the step, the step's gold call
    (None where no call is right)."""

    def is_correct(self, example: Example, api: str | None, args: dict[str, Any] | None) -> bool:
        gold = example.gold
        if gold["call"] is None:
            return not made_call(api, args)
        if not made_call(api, args):
            return False
        model, model_result = run_step(gold["entry"], gold["history"], (api, args))
        truth, gold_result = run_step(gold["entry"], gold["history"], gold["call"])
        return (state_checker(model, truth)["valid"]
                and response_checker([model_result], [gold_result], 0)["valid"])

    def argument_labels(self, example: Example, args: dict[str, Any]) -> dict[str, bool]:
        call = example.gold["call"]
        if call is None:
            return {}
        return {name: name in call[1] and json_equal(value, call[1][name]) for name, value in args.items()}

    def gold_api(self, example: Example) -> str | None:
        call = example.gold["call"]
        return None if call is None else call[0]

    def call_expected(self, example: Example) -> bool | None:
        return None if example.gold["call"] is not None else False


class BfclMultiTurn(MultiTurnLabels, Dataset):
    """BFCL v4's multi-turn categories per step (``conf/dataset/bfcl_multi_turn.yaml``); each category is one "API",
    the steps of one conversation never cross splits. ``max_conversations``: the first N conversations of each
    category (a probe; null for all 200)."""

    name = "bfcl_multi_turn"

    def __init__(self, categories: Sequence[str], max_conversations: int | None = None, **common: Any) -> None:
        super().__init__(**common)
        if isinstance(categories, str) or not categories or any(c not in CATEGORIES for c in categories):
            raise UserError(f"dataset.categories={categories!r}: expected a non-empty list of {list(CATEGORIES)}")
        if max_conversations is not None and (isinstance(max_conversations, bool) or not isinstance(max_conversations, int)
                                              or max_conversations < 1):
            raise UserError(f"dataset.max_conversations={max_conversations!r}: expected a positive integer or null")
        self.categories, self.max_conversations = list(categories), max_conversations

    def load(self, paths: Paths) -> list[Example]:
        folder = bfcl_data_dir()
        examples: list[Example] = []
        for category in self.categories:
            entries = _read(folder / f"BFCL_v4_{category}.json")
            answers = {a["id"]: a["ground_truth"] for a in _read(folder / "possible_answer" / f"BFCL_v4_{category}.json")}
            for entry in entries[: self.max_conversations]:
                try:
                    examples += conversation_steps(category, entry, answers[entry["id"]], self)
                except StepError as error:
                    self.skipped[f"conversations with {error}"] += 1
        return examples

    def source(self) -> str:
        return f"dataset.categories={self.categories}"

    def conversation(self, example: Example) -> str:
        return example.gold["entry"]["id"]


class StepError(Exception):
    """A conversation whose gold calls cannot be replayed (its steps are skipped and counted)."""


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"cannot read BFCL file {path} ({error}); reinstall bfcl-eval with `make run`") from None


def function_docs(classes: Sequence[str]) -> list[dict[str, Any]]:
    """The involved classes' function docs, in BFCL's order."""
    folder = bfcl_data_dir() / "multi_turn_func_doc"
    return [doc for name in classes for doc in _read(folder / MULTI_TURN_FUNC_DOC_FILE_MAPPING[name])]


def backends(entry: dict[str, Any]) -> dict[str, Any]:
    """Fresh instances of the conversation's classes, loaded with its initial config (bfcl-eval's own loading)."""
    instances = {}
    for name in entry["involved_classes"]:
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        if name not in STATELESS_CLASSES:
            instance._load_scenario(copy.deepcopy(entry["initial_config"].get(name, {})),
                                    long_context="long_context" in entry["category"])
        instances[name] = instance
    return instances


def execute(instances: dict[str, Any], name: str, args: dict[str, Any]) -> str:
    """One call's result as BFCL's executor writes it (a dict as JSON, an error as ``Error during execution``)."""
    owner = next((i for i in instances.values() if not name.startswith("_") and inspect.ismethod(getattr(i, name, None))),
                 None)
    try:
        if owner is None or name in FORBIDDEN:
            raise NameError(f"name '{name}' is not defined")
        result = getattr(owner, name)(**args)
    except Exception as error:  # noqa: BLE001 - BFCL's executor turns any failure into the call's result
        return f"Error during execution: {error}"
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def run_step(entry: dict[str, Any], history: Sequence[tuple[str, dict[str, Any]]],
             call: tuple[str, dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """Fresh backends after the gold ``history``, then ``call``: the instances and the call's result."""
    instances = backends(entry)
    for name, args in history:
        execute(instances, name, args)
    return instances, execute(instances, *call)


def parse_call(text: str, instances: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A gold call string (``mv(source='a', destination='b')``, ``sort('f')``) as its name and keyword arguments,
    positional ones named by the backend method's signature."""
    try:
        node = ast.parse(text, mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError("not a plain function call")
        name = node.func.id
        positional = [ast.literal_eval(a) for a in node.args]
        keywords = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        owner = next((i for i in instances.values() if inspect.ismethod(getattr(i, name, None))), None)
        if owner is None:
            raise StepError("a gold call naming no function of its classes")
        bound = inspect.signature(getattr(owner, name)).bind_partial(*positional, **keywords)
    except (SyntaxError, ValueError, TypeError):
        raise StepError("a gold call that does not parse") from None
    return name, dict(bound.arguments)


def conversation_steps(category: str, entry: dict[str, Any], ground_truth: list[list[str]],
                       labels: MultiTurnLabels) -> list[Example]:
    """One example per gold call of the conversation (and per turn whose gold is empty), the gold history before
    it executed in fresh backends."""
    entry = {"id": entry["id"], "category": category, "initial_config": entry["initial_config"],
             "involved_classes": entry["involved_classes"], "question": entry["question"],
             "missed_function": entry.get("missed_function", {})}
    docs = function_docs(entry["involved_classes"])
    held = {name: turn for turn, names in entry["missed_function"].items() for name in names}
    instances = backends(entry)
    turns: list[Turn] = []
    history: list[tuple[str, dict[str, Any]]] = []
    steps: list[Example] = []
    for turn, (messages, gold) in enumerate(zip(entry["question"], ground_truth, strict=True)):
        text = "\n\n".join(m["content"] for m in messages if m["role"] == "user") or \
            DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
        turns.append(Turn("user", text))
        offered = [d for d in docs if d["name"] not in held or int(held[d["name"]]) <= turn]
        calls = [parse_call(call, instances) for call in gold] or [None]
        for step, call in enumerate(calls):
            steps.append(Example(
                id=f"bfcl_multi_turn/{category}/{entry['id'].rsplit('_', 1)[1]}/{turn}/{step}", dataset="bfcl_multi_turn",
                api=category, query=text, tools=json.dumps(offered, ensure_ascii=False),
                tool_names=tuple(d["name"] for d in offered), gold={"entry": entry, "history": list(history), "call": call},
                demo=NO_CALL_DEMO if call is None else format_demo(*call), labels=labels,
                conversation=Conversation("", tuple(turns))))
            if call is not None:
                result = execute(instances, *call)
                if result.startswith("Error during execution"):
                    raise StepError("a gold call that fails in bfcl-eval's backend")
                history.append(call)
                turns += [Turn("assistant", calls=(call,)), Turn("tool", result)]
    return steps


Call = tuple[str, dict[str, Any]]
_CHECK_RUNS = itertools.count()


def call_string(call: Call) -> str:
    """A call as BFCL's decoded model output writes it (``mv(source='a', destination='b')``). A name that is not a
    Python identifier (BFCL ``eval``s these strings) becomes a call of no function, which its executor answers
    with an error, as it would the unparseable name."""
    name, args = call
    if not name.isidentifier() or not all(isinstance(k, str) and k.isidentifier() for k in args):
        return "not_a_function_of_the_classes()"
    return f"{name}({', '.join(f'{key}={value!r}' for key, value in args.items())})"


def bfcl_checker(entry: Mapping[str, Any], model: Sequence[Sequence[Call]], gold: Sequence[Sequence[Call]]) -> bool:
    """``bfcl-eval``'s own ``multi_turn_checker`` as its eval runner calls it: ``model`` and ``gold`` hold one list of
    calls per turn (each model call one step). Its executor keeps the backends of a (model, conversation) pair in
    module globals across turns; each check gets its own name and drops them after."""
    name = f"mice_exp_check_{next(_CHECK_RUNS)}"
    decoded = [[[call_string(c)] for c in turn] for turn in model]
    try:
        return bool(multi_turn_checker(decoded, [[call_string(c) for c in turn] for turn in gold], dict(entry),
                                       entry["category"], name)["valid"])
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            delattr(multi_turn_utils, key)


def checker_agreement(steps: Sequence[Example],
                      calls: Mapping[str, Call | None]) -> tuple[dict[str, bool], dict[str, bool]]:
    """BFCL's own checker on the project's decoded calls (``calls``: step id -> the model's call, None for none), to
    set beside :class:`MultiTurnLabels`. Per step: the conversation up to the step's turn, every call gold but the
    step's, which is the model's (no call: left out). Per conversation: every step the model's (each generated
    after the gold history, so this is the checker on the steps put together, not on a free-running agent).
    Steps whose gold is no call are left out of both (bfcl-eval's runner does not call its irrelevance checker)."""
    conversations: dict[str, list[Example]] = defaultdict(list)
    for step in steps:
        conversations[step.gold["entry"]["id"]].append(step)
    by_step: dict[str, bool] = {}
    by_conversation: dict[str, bool] = {}
    for conversation_id, members in conversations.items():
        entry = members[0].gold["entry"]
        gold = [[] for _ in entry["question"]]
        position = {}
        for step in members:
            turn = int(step.id.rsplit("/", 2)[1])
            if step.gold["call"] is not None:
                position[step.id] = (turn, len(gold[turn]))
                gold[turn].append(step.gold["call"])
        for step_id, (turn, index) in position.items():
            model = [list(turn_calls) for turn_calls in gold[: turn + 1]]
            model[turn][index: index + 1] = [calls[step_id]] if calls[step_id] is not None else []
            by_step[step_id] = bfcl_checker(entry, model, gold[: turn + 1])
        model = [[] for _ in gold]
        for step_id, (turn, _) in position.items():
            if calls[step_id] is not None:
                model[turn].append(calls[step_id])
        by_conversation[conversation_id] = bfcl_checker(entry, model, gold)
    return by_step, by_conversation
