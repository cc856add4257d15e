"""A gate's input and output in the OpenAI chat shape: ``messages`` and ``tools`` in, a :class:`Decision` out.

The Python API (:meth:`mice_exp.gate.Gate.check`) and the server (:mod:`mice_exp.gate.serve`) read requests
through this module, so both refuse the same bad input with the same :class:`InvalidRequest` (a one-line
:class:`~mice_exp.errors.UserError` that also carries the HTTP status, ``param`` and ``code`` OpenAI's API
would answer with). Torch-free.

How a chat request becomes the gate's prompt: the gate was calibrated on single-turn queries, so the query
is the text of the last message, which must be a user turn; the caller's system and earlier turns are not
shown (the gate's own system text, tool section and retrieved demonstrations are, as in training). The
tools are OpenAI function schemas: a gate trained under ``prompt.tools=schemas`` (``prompt=json_tools``)
gets them as they are; one trained under ``prompt.tools=text`` (``prompt=ste``) gets each in STE's
RapidAPI text form (:func:`mice_exp.data.schemas.ste_text`), or refuses a tool that form cannot show.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

from mice_exp.data.records import Example
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
    """A parsed tool call."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """The gate's answer to one request.

    ``probability`` is the gate's calibrated P(the call is correct); ``arguments`` says, for each top-level
    argument, the product of its value tokens' probabilities (where the model was unsure, not whether the
    call is right); ``execute`` is ``call is not None and probability > tau``. ``call`` is None when the
    reply holds no parseable call (``parse_error`` says why; ``text`` is the reply as generated).
    """

    call: Call | None
    probability: float
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


def user_query(messages: Any) -> str:
    """The text of the conversation's last message, which must be a user turn (the gate answers it)."""
    if messages is None:
        raise InvalidRequest("Missing required parameter: 'messages'", param="messages",
                             code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list of chat messages", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise InvalidRequest(f"messages[{i}] is {json.dumps(message)[:80]}; expected an object with a role in "
                                 f"{', '.join(ROLES)}", param=f"messages[{i}].role")
    last = len(messages) - 1
    if messages[last]["role"] != "user":
        raise InvalidRequest(f"messages[{last}] is a {messages[last]['role']} turn; the gate answers the last user "
                             "turn with one tool call, so expected the conversation to end with a user message",
                             param=f"messages[{last}].role")
    content = messages[last].get("content")
    if isinstance(content, list):  # content parts: the text ones, in order
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InvalidRequest(f"messages[{last}].content: the gate reads text parts only", param=f"messages[{last}].content")
        content = "\n".join(p["text"] for p in content)
    if not isinstance(content, str) or not content.strip():
        raise InvalidRequest(f"messages[{last}].content: expected the user's text", param=f"messages[{last}].content")
    return content


def chat_example(messages: Messages, tools: Any, index: int, schemas: bool) -> Example:
    """A chat request as the :class:`Example` the gate's prompt builder takes (no gold: it is unknown);
    ``schemas``: the gate shows tools as JSON schemas, else in STE's text form."""
    query = user_query(messages)
    checked = check_tools(tools)
    if schemas:
        text = json.dumps(checked, ensure_ascii=False)
    else:
        try:
            text = "\n\n".join(ste_text(s) for s in checked)
        except UserError as error:
            raise InvalidRequest(str(error), param="tools", code="invalid_function_parameters") from None
    return Example(id=f"gate/{index}", dataset="jsonl", api="gate", query=query, tools=text,
                   tool_names=tuple(s["function"]["name"] for s in checked),
                   gold={"action": None, "action_input": None}, demo="")


#: JSON Schema's type names and the Python values each admits (a bool is no number).
_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
               "object": (dict,), "null": (type(None),)}


def read_call(call: Any, where: str = "call") -> tuple[str, str]:
    """The name and the argument text of a proposed tool call, in OpenAI's shape ``{"type": "function", "id"?,
    "function": {"name", "arguments"}}`` or bare ``{"name", "arguments"}``; ``arguments`` a JSON string (kept
    verbatim: it is what the agent's model wrote) or an object (written as compact JSON). A call that is not
    such an object is an :class:`InvalidRequest`; one whose arguments are not valid JSON is not (the gate
    answers it: :func:`call_problem`)."""
    if not isinstance(call, dict):
        raise InvalidRequest(f"{where} is {json.dumps(call)[:60]}; expected a tool call "
                             '{"type": "function", "function": {"name": ..., "arguments": "{...}"}}', param=where)
    if "function" in call or call.get("type") == "function":
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
    function schemas), arguments that are not a JSON object, or that do not match the tool's parameters
    (a required one missing, one the schema does not admit, a value of another type or outside its enum)."""
    schema = next((t["function"] for t in tools if t["function"]["name"] == name), None)
    if schema is None:
        offered = ", ".join(t["function"]["name"] for t in tools)
        return f"the call names {name!r}, which is not among the tools offered ({offered})"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as error:
        return f"the arguments of {name!r} are not valid JSON ({error.msg}); expected a JSON object"
    if not isinstance(args, dict):
        return f"the arguments of {name!r} are {type(args).__name__}; expected a JSON object"
    parameters = schema.get("parameters") or {}
    properties = parameters.get("properties", {})
    missing = [r for r in parameters.get("required", []) if r not in args]
    if missing:
        return f"the call to {name!r} lacks the required argument {missing[0]!r}"
    for key, value in args.items():
        if key not in properties:
            if parameters.get("additionalProperties", True) is False:
                return f"the call to {name!r} has the argument {key!r}, which its schema does not admit"
            continue
        problem = _value_problem(properties[key], value)
        if problem:
            return f"the call to {name!r} has {key}={json.dumps(value)[:40]}: {problem}"
    return None


def _value_problem(schema: dict[str, Any], value: Any) -> str | None:
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if kinds and not any(isinstance(value, _JSON_TYPES.get(k, object))
                         and not (isinstance(value, bool) and k != "boolean") for k in kinds):
        return f"expected {' or '.join(kinds)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"expected one of {json.dumps(schema['enum'])[:60]}"
    return None
