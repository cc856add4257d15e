"""Parse a generated tool call, find where it stops, and mark its content tokens.

The content of a call is its API name and its argument JSON; "Action:", "Action Input:",
whitespace and anything after the JSON are formatting. Raw confidence multiplies the
probabilities of content tokens only (MICE section 4.4).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

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


@dataclass(frozen=True)
class Spans:
    """Character spans of a call's content inside the generated text."""

    api: tuple[int, int] | None
    args: tuple[int, int] | None


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


@dataclass(frozen=True)
class ToolCall:
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
