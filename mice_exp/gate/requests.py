"""A batch of chat requests as the gate's calls: each ``(messages, tools)`` as the example its prompt is built
for, each proposed call as the reply it is scored as, and what refuses the batch (:class:`~mice_exp.gate.chat.
InvalidRequest`, naming the request when there are several, in one line).

What one request's parts must be is :mod:`mice_exp.gate.chat`'s; this module reads a batch of them.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from mice_exp.data.records import Example
from mice_exp.errors import UserError
from mice_exp.gate.chat import InvalidRequest, Messages, call_problem, chat_example, check_tools, read_call
from mice_exp.llm.prompt import PromptTooLong
from mice_exp.llm.toolcall import CallFormat


def numbered(error: InvalidRequest, index: int, n_requests: int) -> InvalidRequest:
    """A request's error as a batch of ``n_requests`` reports it (naming the request when there are several)."""
    return error if n_requests == 1 else InvalidRequest(f"request #{index}: {error}", error.param, error.code,
                                                        error.status)


def chat_examples(requests: Sequence[tuple[Messages, Any]], schemas: bool) -> dict[int, Example]:
    """Each ``(messages, tools)`` request as the :class:`Example` the prompt builder takes (``schemas``: the gate
    shows tools as JSON schemas, :func:`~mice_exp.gate.chat.chat_example`)."""
    examples = {}
    for i, (messages, tools) in enumerate(requests):
        try:
            examples[i] = chat_example(messages, tools, i, schemas)
        except InvalidRequest as error:
            raise numbered(error, i, len(requests)) from None
    return examples


def canonical_reply(fmt: CallFormat, name: str, arguments: str, where: str = "") -> str:
    """A proposed call as the gate scores it: in the canonical layout (:meth:`~mice_exp.llm.toolcall.CallFormat.
    canonical`) whatever layout, key order or escaping its JSON came in, so one call gets one probability under
    every host (the Agents SDK hands on the model's text, LangChain re-serialises it)."""
    parsed = json.loads(arguments)  # an object: a call with a problem (call_problem) is not scored
    try:
        return fmt.canonical(name, parsed)
    except ValueError as error:
        raise InvalidRequest(f"{where}{error}", param="tool_calls") from None


def proposed_replies(requests: Sequence[tuple[Messages, Any, Any]],
                     fmt: CallFormat) -> tuple[dict[int, str], dict[int, str | None]]:
    """Each ``(messages, tools, call)`` request's call as a reply in the gate's reply format ``fmt`` (canonical,
    :func:`canonical_reply`, where it can be executed), and why it cannot be executed as it stands (None where it
    can: :func:`~mice_exp.gate.chat.call_problem`)."""
    replies, problems = {}, {}
    for i, (_, tools, call) in enumerate(requests):
        try:
            name, arguments = read_call(call)
        except InvalidRequest as error:
            raise numbered(error, i, len(requests)) from None
        problems[i] = call_problem(name, arguments, check_tools(tools))
        replies[i] = (fmt.write(name, arguments) if problems[i] else
                      canonical_reply(fmt, name, arguments, f"request #{i}: " if len(requests) > 1 else ""))
    return replies, problems


def refuse_unprompted(refused: Mapping[int, UserError], n_requests: int, llm: str) -> None:
    """Refuse the batch for its first request that has no prompt (the others are not answered either): one too
    long for ``llm``'s context window even without demonstrations is OpenAI's ``context_length_exceeded``."""
    for i, error in refused.items():
        where = "" if n_requests == 1 else f"request #{i}: "
        if not isinstance(error, PromptTooLong):
            raise InvalidRequest(f"{where}{error}", param="tools")
        raise InvalidRequest(f"{where}the gate's prompt for these messages and tools has {error.tokens} tokens "
                             f"without demonstrations; {llm}'s context window leaves {error.budget} "
                             "(llm.context_window minus llm.max_new_tokens); expected shorter messages or fewer tools",
                             param="messages", code="context_length_exceeded")


def call_too_long(index: int, n_calls: int, reply_tokens: int, prompt_tokens: int, llm: str,
                  window: int) -> InvalidRequest:
    """A proposed call that does not fit ``llm``'s context window after its request's prompt."""
    where = "the call" if n_calls == 1 else f"request #{index}: the call"
    return InvalidRequest(f"{where} is {reply_tokens} tokens after a prompt of {prompt_tokens}; {llm}'s context "
                          f"window holds {window} (llm.context_window); expected a shorter call or shorter messages",
                          param="tool_calls", code="context_length_exceeded")
