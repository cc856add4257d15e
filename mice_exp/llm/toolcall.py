"""Parse a generated tool call, find where it stops, and mark its content tokens, in each reply format.

The content of a call is its API name and its argument JSON; everything else ("Action:", "Action Input:",
the JSON keys "name" and "arguments", ``<tool_call>`` tags, whitespace, anything after the call) is
formatting. Raw confidence multiplies the probabilities of content tokens only (MICE section 4.4).

``prompt.format`` picks the :class:`CallFormat` (:data:`FORMATS`):

* ``react``: STE's ``Action: <name>`` / ``Action Input: {...}`` (:func:`parse_call`, :func:`find_spans`,
  :func:`stop_offset`), the format every record before ``prompt=json_tools`` was made in;
* ``json``: one JSON object ``{"name": ..., "arguments": {...}}`` ("parameters" is read as "arguments",
  as Llama 3's template asks for it), the first one in the reply;
* ``tool_call``: that object inside a ``<tool_call>...</tool_call>`` block (Hermes / Qwen), the first block.

Only the first call counts (STE: "only perform a SINGLE action"); generation stops once it is complete.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from mice_exp.data.records import format_demo
from mice_exp.errors import UserError

_ACTION = re.compile(r"Action\s*:[ \t]*")
_ACTION_INPUT = re.compile(r"Action\s*Input\s*:\s*")
_STOP_WORD = "Observation"


def json_object_end(text: str, start: int) -> int | None:
    """Index just past the ``}`` that closes the object opened at ``text[start] == '{'``, or None."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        char = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


Span = tuple[int, int]
_DECODER = json.JSONDecoder()


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def member_spans(text: str, start: int) -> Iterator[tuple[str, Span]]:
    """Each top-level member of the JSON object opened at ``text[start] == '{'``, in order: its key and its
    value's span; a value that is an object spans its balanced braces
    (:func:`json_object_end`) even where its content is not valid JSON. Stops at the object's end and
    raises ValueError at the first member that does not parse, after yielding the ones before it."""
    i = _skip_space(text, start + 1)
    while i < len(text) and text[i] != "}":
        key, end = _DECODER.raw_decode(text, i)
        i = _skip_space(text, end)
        if i >= len(text) or text[i] != ":":
            raise ValueError(f"no ':' after key {key!r}")
        value = _skip_space(text, i + 1)
        end = json_object_end(text, value) if text.startswith("{", value) else _DECODER.raw_decode(text, value)[1]
        if end is None:
            raise ValueError(f"the object of key {key!r} does not close")
        yield str(key), (value, end)
        i = _skip_space(text, end)
        i = _skip_space(text, i + 1) if i < len(text) and text[i] == "," else i


@dataclass(frozen=True)
class Spans:
    """Character spans of a call's content inside the generated text."""

    api: Span | None
    args: Span | None


def find_spans(text: str) -> Spans:
    """Locate the API name (after the first "Action:") and the argument JSON (after "Action Input:")."""
    action = _ACTION.search(text)
    api_span = None
    search_from = 0
    if action:
        line_end = text.find("\n", action.end())
        line_end = len(text) if line_end < 0 else line_end
        name = text[action.end():line_end]
        stripped = name.rstrip()
        if stripped:
            api_span = (action.end(), action.end() + len(stripped))
        search_from = action.end()
    args_span = None
    action_input = _ACTION_INPUT.search(text, search_from)
    if action_input:
        brace = text.find("{", action_input.end())
        if brace >= 0:
            end = json_object_end(text, brace)
            if end is not None:
                args_span = (brace, end)
    return Spans(api=api_span, args=args_span)


def stop_offset(text: str) -> int | None:
    """Where generation should stop: just past the argument JSON, or before "Observation"."""
    ends = []
    spans = find_spans(text)
    if spans.args is not None:
        ends.append(spans.args[1])
    word = text.find(_STOP_WORD)
    if word >= 0:
        ends.append(word)
    return min(ends) if ends else None


def canonical_json(args: Any) -> str:
    """A call's arguments in the one layout every call is scored in (:meth:`CallFormat.canonical`): keys sorted at
    every depth, ``json.dumps``' own spacing on one line, non-ASCII characters as themselves (``\\u00e9`` and ``é``
    are one value). Teacher forcing scores tokens, and a judge finds a layout it never wrote unlikely: one right
    call scored 0.665 indented and 0.249 compact before every call was rendered this way. A string that is no
    Unicode text (a lone UTF-16 surrogate, which JSON's ``\\ud800`` escape can carry) is a ValueError."""
    text = json.dumps(args, ensure_ascii=False, sort_keys=True)
    bad = next((c for c in text if "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        raise ValueError(f"the arguments hold a lone UTF-16 surrogate ({bad!r}); expected valid Unicode text")
    return text


@dataclass(frozen=True)
class ToolCall:
    """A parsed call; ``parse_error`` says why there is none (then ``args`` is None: no call)."""

    api: str | None
    args: dict | None
    parse_error: str | None


def parse_call(text: str) -> ToolCall:
    """The API name and parsed arguments; unparseable output is flagged, never raised."""
    spans = find_spans(text)
    api = text[spans.api[0]:spans.api[1]].strip() if spans.api else None
    if api is None:
        return ToolCall(None, None, "no 'Action:' line")
    if spans.args is None:
        return ToolCall(api, None, "no complete JSON object after 'Action Input:'")
    try:
        args = json.loads(text[spans.args[0]:spans.args[1]])
    except json.JSONDecodeError as error:
        return ToolCall(api, None, f"invalid argument JSON: {error.msg}")
    return ToolCall(api, args, None)


def content_mask(offsets: Sequence[tuple[int, int]], spans: Spans) -> list[bool]:
    """For each token (char start, end), whether it overlaps the API name or the argument JSON."""
    content = [s for s in (spans.api, spans.args) if s is not None]
    return [any(start < hi and end > lo for lo, hi in content) for start, end in offsets]


class CallFormat(ABC):
    """How a reply writes a tool call: what the LLM stage's stopping rule, records, labels and per-argument
    confidences read in it, and how a demonstration's gold call is written in it. Stateless; one of
    :data:`FORMATS`, picked by name (:func:`call_format`)."""

    name: str

    @abstractmethod
    def spans(self, text: str) -> Spans:
        """The call's content: its API name and its argument object."""

    @abstractmethod
    def stop_offset(self, text: str) -> int | None:
        """Where generation should stop (just past the first complete call), or None to go on."""

    @abstractmethod
    def parse(self, text: str) -> ToolCall:
        """The first call in ``text``; none (``parse_error`` set) where it does not parse."""

    @abstractmethod
    def write(self, api: str, args: dict[str, Any] | str) -> str:
        """The call ``api(**args)`` as a reply in this format; ``args`` as JSON text is written verbatim (a
        proposed call scored as its model wrote it)."""

    def canonical(self, api: str, args: dict[str, Any]) -> str:
        """The call as every judge scores it (:func:`canonical_json`): the same text for any layout, key order or
        escaping its JSON came in, so that what a gate was fitted on is what it scores."""
        return self.write(api.strip(), canonical_json(args))

    def demonstration(self, demo: str) -> str:
        """A demonstration's reply in this format: ``demo`` is kept in STE's format (:func:`format_demo`),
        so its call is rewritten; a demo without a call (BFCL's irrelevance reply) stays as it is."""
        call = parse_call(demo)
        return demo if call.parse_error else self.write(call.api, call.args)


class React(CallFormat):
    """STE's ``Action:`` / ``Action Input:`` lines (the module's functions; demonstrations as they are)."""

    name = "react"

    def spans(self, text: str) -> Spans:
        return find_spans(text)

    def stop_offset(self, text: str) -> int | None:
        return stop_offset(text)

    def parse(self, text: str) -> ToolCall:
        return parse_call(text)

    def write(self, api: str, args: dict[str, Any] | str) -> str:
        return format_demo(api, args)

    def demonstration(self, demo: str) -> str:
        return demo


class JsonObject(CallFormat):
    """The first JSON object in the reply, ``{"name": <api>, "arguments": {...}}``."""

    name = "json"
    MISSING = "no JSON object"  # the parse error of a reply with no call object
    _ARGUMENT_KEYS = ("arguments", "parameters")

    def call_start(self, text: str) -> int | None:
        """Index of the ``{`` that opens the call object, or None."""
        brace = text.find("{")
        return brace if brace >= 0 else None

    def _members(self, text: str, start: int) -> dict[str, Span]:
        """Value spans of the call object's members, as far as they parse."""
        found: dict[str, Span] = {}
        try:
            for key, value in member_spans(text, start):
                found.setdefault(key, value)
        except ValueError:
            pass  # a malformed member ends the object's readable part
        return found

    def spans(self, text: str) -> Spans:
        start = self.call_start(text)
        if start is None:
            return Spans(None, None)
        members = self._members(text, start)
        name = members.get("name")
        api = (name[0] + 1, name[1] - 1) if name and text[name[0]] == '"' and name[1] - name[0] > 2 else None
        args = next((members[k] for k in self._ARGUMENT_KEYS if k in members and text[members[k][0]] == "{"), None)
        return Spans(api, args)

    def stop_offset(self, text: str) -> int | None:
        start = self.call_start(text)
        return None if start is None else json_object_end(text, start)

    def parse(self, text: str) -> ToolCall:
        start = self.call_start(text)
        if start is None:
            return ToolCall(None, None, self.MISSING)
        end = json_object_end(text, start)
        if end is None:
            return ToolCall(None, None, "the call's JSON object does not close")
        try:
            call = json.loads(text[start:end])
        except json.JSONDecodeError as error:
            return ToolCall(None, None, f"invalid call JSON: {error.msg}")
        api = call.get("name")
        if not isinstance(api, str) or not api.strip():
            return ToolCall(None, None, "the call's JSON object has no 'name' string")
        args = next((call[k] for k in self._ARGUMENT_KEYS if k in call), None)
        if not isinstance(args, dict):
            return ToolCall(api.strip(), None, "the call's JSON object has no 'arguments' object")
        return ToolCall(api.strip(), args, None)

    def write(self, api: str, args: dict[str, Any] | str) -> str:
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return f'{{"name": {json.dumps(api, ensure_ascii=False)}, "arguments": {text}}}'  # json.dumps' own spacing


class TaggedJson(JsonObject):
    """The call object inside the first ``<tool_call>`` block (Hermes / Qwen); the closing tag is optional,
    generation stops once the object closes (or at a ``</tool_call>`` that comes first)."""

    name = "tool_call"
    MISSING = "no '<tool_call>' block opening a JSON object"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def call_start(self, text: str) -> int | None:
        tag = text.find(self.OPEN)
        if tag < 0:
            return None
        brace = _skip_space(text, tag + len(self.OPEN))
        return brace if text.startswith("{", brace) else None

    def stop_offset(self, text: str) -> int | None:
        ends = [super().stop_offset(text)]
        tag = text.find(self.OPEN)
        close = text.find(self.CLOSE, tag) if tag >= 0 else -1
        ends.append(close + len(self.CLOSE) if close >= 0 else None)
        return min((e for e in ends if e is not None), default=None)

    def write(self, api: str, args: dict[str, Any] | str) -> str:
        return f"{self.OPEN}\n{super().write(api, args)}\n{self.CLOSE}"


REACT = React()
#: ``prompt.format`` -> its reply format.
FORMATS: dict[str, CallFormat] = {f.name: f for f in (REACT, JsonObject(), TaggedJson())}


def call_format(name: str) -> CallFormat:
    """The reply format ``prompt.format`` names (:attr:`mice_exp.llm.settings.PromptSettings.fmt`)."""
    if name not in FORMATS:
        raise UserError(f"prompt.format={name!r}; expected one of {', '.join(FORMATS)}")
    return FORMATS[name]
