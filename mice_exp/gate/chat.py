"""A gate's input and output in the OpenAI chat shape: ``messages`` and ``tools`` in, a :class:`Decision` out.

The Python API (:meth:`mice_exp.gate.Gate.check`) and the server (:mod:`mice_exp.gate.app`) read requests
through this module, so both refuse the same bad input with the same :class:`InvalidRequest` (a one-line
:class:`~mice_exp.errors.UserError` that also carries the HTTP status, ``param`` and ``code`` OpenAI's API
would answer with). Torch-free.

How a chat request becomes the gate's prompt: the whole conversation is shown (:func:`conversation`; the
caller's system text after the gate's own instructions, then the retrieved demonstrations, then every turn
in the reply format's text form, :class:`mice_exp.llm.prompt.PromptBuilder`); demonstrations are retrieved
for the last user turn. The gate was fitted on single-turn queries: on a call made after earlier turns its
probability is an extrapolation until the multi-turn calibration is measured (README). The
tools are OpenAI function schemas: a gate trained under ``prompt.tools=schemas`` (``prompt=json_tools``)
gets them as they are; one trained under ``prompt.tools=text`` (``prompt=ste``) gets each in STE's
RapidAPI text form (:func:`mice_exp.data.schemas.ste_text`), or refuses a tool that form cannot show.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for

from mice_exp.data.records import Conversation, Example, Turn
from mice_exp.data.schemas import Schema, function_schema, object_schema_problem, ste_text
from mice_exp.errors import UserError

#: The roles of OpenAI's chat messages.
ROLES = ("system", "developer", "user", "assistant", "tool", "function")

Messages = Sequence[dict[str, Any]]


class InvalidRequest(UserError):
    """A request the gate cannot answer: one line, with what OpenAI's API would send back for it."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


@dataclass(frozen=True)
class Call:
    """A parsed tool call; ``text`` is its argument JSON as the gate scored it: in the canonical layout
    (:func:`~mice_exp.llm.toolcall.canonical_json`; indentation, key order and escapes change no score), handed
    on as OpenAI's ``arguments``."""

    name: str
    arguments: dict[str, Any]
    text: str | None = field(default=None, compare=False)

    @property
    def arguments_json(self) -> str:
        """The argument JSON to hand on: as written where known, else compact."""
        return self.text if self.text is not None else json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class Decision:
    """The gate's answer to one request.

    ``probability`` is the gate's calibrated P(the call is correct), None for a proposed call denied before scoring
    (one that cannot be executed as it stands: ``reason`` says why); ``arguments`` says, for each top-level
    argument, the product of its value tokens' probabilities (where the model was unsure, not whether the
    call is right); ``execute`` is ``call is not None and probability > tau``. ``call`` is None when the
    reply holds no parseable call (``parse_error`` says why; ``text`` is the reply as generated).
    """

    call: Call | None
    probability: float | None
    arguments: dict[str, float]
    execute: bool
    tau: float
    text: str
    parse_error: str | None
    prompt_tokens: int
    completion_tokens: int

    @property
    def reason(self) -> str | None:
        """Why there is no call to execute whatever the probability (a tool not offered, arguments that do not
        parse or do not match the tool's schema), else None."""
        return self.parse_error

    @property
    def least_certain(self) -> str | None:
        """The argument the model was least sure of (None without arguments): what to ask the user about."""
        return min(self.arguments, key=self.arguments.__getitem__) if self.arguments else None


def check_tau(tau: Any) -> float:
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 <= tau <= 1.0 or math.isnan(tau):
        raise InvalidRequest(f"tau={tau!r}; expected a number in [0, 1] (execute iff probability > tau)",
                             param="mice_exp.tau")
    return float(tau)


def check_tools(tools: Any) -> list[Schema]:
    """OpenAI function tools, checked: ``[{"type": "function", "function": {"name", "description"?,
    "parameters"?}}]``; ``parameters`` an object schema whose ``required`` names its properties. Names may be
    any one-line string (STE's have spaces and ``%%``), not only OpenAI's ``[a-zA-Z0-9_-]{1,64}``."""
    if tools is None:
        raise InvalidRequest("Missing required parameter: 'tools'; the gate scores tool calls, so it needs the "
                             "function tools the model may call", param="tools", code="missing_required_parameter")
    if not isinstance(tools, list) or not tools:
        raise InvalidRequest(f"'tools' is {json.dumps(tools)[:60]}; expected a non-empty list of "
                             '{"type": "function", "function": {...}} objects', param="tools")
    try:
        json.dumps(tools, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidRequest(f"'tools' holds a lone UTF-16 surrogate ({error.object[error.start]!r}); expected valid "
                             "Unicode text", param="tools") from None
    schemas, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise InvalidRequest(f'{where}: expected {{"type": "function", "function": {{"name", "description", '
                                 f'"parameters"}}}}, got {json.dumps(tool)[:80]}', param=where)
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not name.strip() or name != name.strip() or "\n" in name:
            raise InvalidRequest(f"{where}.function.name is {name!r}; expected a non-empty one-line string",
                                 param=f"{where}.function.name", code="invalid_value")
        if name in names:
            raise InvalidRequest(f"{where}: a second tool named {name!r}; expected unique names",
                                 param=f"{where}.function.name", code="invalid_value")
        names.add(name)
        description = function.get("description", "")
        if not isinstance(description, str):
            raise InvalidRequest(f"{where}.function.description: expected a string",
                                 param=f"{where}.function.description", code="invalid_value")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        problem = object_schema_problem(parameters)
        if problem:
            raise InvalidRequest(f"Invalid schema for function {name!r}: {problem}",
                                 param=f"{where}.function.parameters", code="invalid_function_parameters")
        schemas.append(function_schema(name, description, parameters))
    return schemas


def _text(content: Any, where: str, what: str, *, empty: bool = False) -> str:
    """A message's text: a string, or OpenAI's content parts, of which text parts only (joined by lines)."""
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InvalidRequest(f"{where}: the gate reads text parts only", param=where)
        content = "\n".join(p["text"] for p in content)
    if content is None and empty:
        return ""
    if not isinstance(content, str) or not (content.strip() or empty):
        raise InvalidRequest(f"{where}: expected {what}", param=where)
    bad = next((i for i, c in enumerate(content) if "\ud800" <= c <= "\udfff"), None)
    if bad is not None:  # a lone surrogate ("\\ud800" in JSON) is no character any tokenizer can encode
        raise InvalidRequest(f"{where} holds a lone UTF-16 surrogate ({content[bad]!r}) at character {bad}; "
                             "expected valid Unicode text", param=where)
    return content


def _arguments(value: Any, where: str) -> dict[str, Any]:
    """A call's arguments: a JSON object, or its text (OpenAI's ``function.arguments``)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as error:
            raise InvalidRequest(f"{where} is not valid JSON ({error.msg}); expected the arguments as a JSON object "
                                 "string", param=where) from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} is {json.dumps(value)[:60]}; expected a JSON object of arguments", param=where)
    return value


def tool_call(call: Any, where: str) -> tuple[str | None, Call]:
    """An earlier assistant turn's tool call (:func:`read_call`'s shapes) as its id and :class:`Call`; its
    arguments must be a JSON object, since the prompt writes the call again in the reply format."""
    name, arguments = read_call(call, where)
    ident = call.get("id")
    if ident is not None and not isinstance(ident, str):
        raise InvalidRequest(f"{where}.id is {ident!r}; expected a string", param=f"{where}.id")
    return ident, Call(name, _arguments(arguments, f"{where}.function.arguments"))


def conversation(messages: Any) -> Conversation:
    """A chat's messages as the :class:`~mice_exp.data.records.Conversation` the gate's prompt shows, every message
    in it or refused in one line: system / developer text first (the prompt shows it once, in its system turn),
    then user, assistant (text and tool calls) and tool turns, each tool result answering a call of the
    assistant turn before it, every call answered before the conversation goes on. The conversation ends with
    the user's turn (the gate answers it) or with tool results (the gate gives the model's next reply)."""
    if messages is None:
        raise InvalidRequest("Missing required parameter: 'messages'", param="messages",
                             code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list of chat messages", param="messages")
    system: list[str] = []
    turns: list[Turn] = []
    open_calls: dict[str, str] = {}  # the last assistant turn's calls not yet answered: id -> name
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise InvalidRequest(f"{where} is {json.dumps(message)[:80]}; expected an object with a role in "
                                 f"{', '.join(ROLES)}", param=f"{where}.role")
        if role == "function" or "function_call" in message:
            raise InvalidRequest(f"{where}: the legacy function-call messages are not read; expected assistant "
                                 "tool_calls and tool messages with a tool_call_id", param=f"{where}.role")
        if role != "tool" and open_calls:
            raise InvalidRequest(f"{where}: the call {next(iter(open_calls.values()))!r} (id "
                                 f"{next(iter(open_calls))!r}) has no tool result; expected a tool message for each "
                                 "call before the conversation goes on", param=where)
        if role in ("system", "developer"):
            if turns:
                raise InvalidRequest(f"{where} is a {role} message after the conversation began; the gate's prompt "
                                     f"shows system text once, at its start; expected {role} messages first",
                                     param=f"{where}.role")
            system.append(_text(message.get("content"), f"{where}.content", f"the {role} text"))
        elif role == "user":
            turns.append(Turn("user", _text(message.get("content"), f"{where}.content", "the user's text")))
        elif role == "assistant":
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise InvalidRequest(f"{where}.tool_calls: expected a list of tool calls", param=f"{where}.tool_calls")
            parsed = [tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
            text = _text(message.get("content"), f"{where}.content", "the assistant's text", empty=True)
            if not parsed and not text.strip():
                raise InvalidRequest(f"{where}: an assistant message with neither text nor tool calls; expected one",
                                     param=f"{where}.content")
            open_calls = {ident or f"#{j}": call.name for j, (ident, call) in enumerate(parsed)}
            turns.append(Turn("assistant", text, tuple((c.name, c.arguments) for _, c in parsed)))
        else:
            ident = message.get("tool_call_id")
            if not isinstance(ident, str) or not ident:
                raise InvalidRequest(f"{where}: a tool message without a tool_call_id; expected the id of the call it "
                                     "answers", param=f"{where}.tool_call_id", code="missing_required_parameter")
            if ident not in open_calls:
                raise InvalidRequest(f"{where}.tool_call_id {ident!r} matches no unanswered call of the assistant turn "
                                     f"before it (its calls: {', '.join(map(repr, open_calls)) or 'none'})",
                                     param=f"{where}.tool_call_id")
            del open_calls[ident]
            result = _text(message.get("content"), f"{where}.content", "the tool's result", empty=True)
            turns.append(Turn("tool", result))
    last = len(messages) - 1
    if turns and turns[-1].role == "assistant":
        raise InvalidRequest(f"messages[{last}] is an assistant turn; the gate answers the conversation's last turn, "
                             "so expected the conversation to end with a user message or with tool results",
                             param=f"messages[{last}].role")
    if not any(t.role == "user" for t in turns):
        raise InvalidRequest("'messages' holds no user message; expected the user's query", param="messages")
    return Conversation("\n\n".join(system), tuple(turns))


def chat_example(messages: Messages, tools: Any, index: int, schemas: bool) -> Example:
    """A chat request as the :class:`Example` the gate's prompt builder takes (no gold: it is unknown);
    ``schemas``: the gate shows tools as JSON schemas, else in STE's text form."""
    chat = conversation(messages)
    checked = check_tools(tools)
    if schemas:
        text = json.dumps(checked, ensure_ascii=False)
    else:
        try:
            text = "\n\n".join(ste_text(s) for s in checked)
        except UserError as error:
            raise InvalidRequest(str(error), param="tools", code="invalid_function_parameters") from None
    query = next(t.text for t in reversed(chat.turns) if t.role == "user")
    return Example(id=f"gate/{index}", dataset="jsonl", api="gate", query=query, tools=text,
                   tool_names=tuple(s["function"]["name"] for s in checked),
                   gold={"action": None, "action_input": None}, demo="", conversation=chat)


def read_call(call: Any, where: str = "call") -> tuple[str, str]:
    """The name and the argument text of a proposed tool call, in OpenAI's shape ``{"type": "function", "id"?,
    "function": {"name", "arguments"}}`` or bare ``{"name", "arguments"}``; ``arguments`` a JSON string (kept
    verbatim: it is what the agent's model wrote) or an object (written as compact JSON). A call that is not
    such an object is an :class:`InvalidRequest`; one whose arguments are not valid JSON is not (the gate
    answers it: :func:`call_problem`)."""
    if not isinstance(call, dict):
        raise InvalidRequest(f"{where} is {json.dumps(call)[:60]}; expected a tool call "
                             '{"type": "function", "function": {"name": ..., "arguments": "{...}"}}', param=where)
    if call.get("type", "function") != "function":
        raise InvalidRequest(f"{where}.type is {json.dumps(call.get('type'))[:40]}; the gate judges function calls "
                             '(expected "type": "function")', param=f"{where}.type", code="invalid_value")
    if "function" in call or "type" in call:
        if not isinstance(call.get("function"), dict):
            raise InvalidRequest(f"{where} has no 'function' object; expected {{\"type\": \"function\", "
                                 f"\"function\": {{\"name\": ..., \"arguments\": \"{{...}}\"}}}}",
                                 param=f"{where}.function")
        call, where = call["function"], f"{where}.function"
    name, arguments = call.get("name"), call.get("arguments", "{}")
    if not isinstance(name, str) or not name.strip() or "\n" in name:
        raise InvalidRequest(f"{where}.name is {name!r}; expected the name of one of the tools offered",
                             param=f"{where}.name", code="invalid_value")
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not isinstance(arguments, str):
        raise InvalidRequest(f"{where}.arguments is {json.dumps(arguments)[:60]}; expected a JSON object, as a "
                             "string or an object", param=f"{where}.arguments", code="invalid_value")
    return name, arguments


def call_problem(name: str, arguments: str, tools: Sequence[dict[str, Any]]) -> str | None:
    """Why a proposed call cannot be executed as it stands, or None: a tool not among ``tools`` (checked
    function schemas), arguments that are not a JSON object, or that its parameters' JSON schema does not admit
    (a required one missing, one the schema does not admit, a value of another type, outside its enum, none of
    an ``anyOf``'s alternatives, a nested object's or an array item's problem: the schema's own validator)."""
    schema = next((t["function"] for t in tools if t["function"]["name"] == name), None)
    if schema is None:
        offered = ", ".join(t["function"]["name"] for t in tools)
        return f"the call names {name!r}, which is not among the tools offered ({offered})"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as error:
        return f"the arguments of {name!r} are not valid JSON ({error.msg}); expected a JSON object"
    except RecursionError:
        return f"the arguments of {name!r} nest too deeply to read; expected a JSON object of arguments"
    if not isinstance(args, dict):
        return f"the arguments of {name!r} are {type(args).__name__}; expected a JSON object"
    parameters = schema.get("parameters") or {"type": "object"}
    error = best_match(validator_for(parameters)(parameters).iter_errors(args))
    if error is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    if error.validator == "required":
        missing = next(r for r in error.validator_value if r not in error.instance)
        return f"the call to {name!r} lacks the required argument {(where + '.' if where else '') + missing!r}"
    if not where:
        return f"the call to {name!r}: {error.message}"
    return f"the call to {name!r} has {where}={json.dumps(error.instance)[:40]}: {error.message}"
