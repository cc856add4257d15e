"""The one record type every loader produces, so later stages never see dataset formats."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from mice_exp.data.schemas import Schema, tool_schemas


class Labels:
    """How a generated call is labelled against an example's gold: each data set's rule
    (:class:`mice_exp.data.dataset.Dataset` implements it, and every example it loads carries it, so no stage
    asks which data set an example came from). This base is the rule where there is no gold (a gate's queries):
    no call is correct and no argument is labelled."""

    def is_correct(self, example: Example, api: str | None, args: dict[str, Any] | None) -> bool:
        """Whether the call ``api(**args)`` is right for ``example`` (``None``: an unparseable reply)."""
        return False

    def argument_labels(self, example: Example, args: dict[str, Any]) -> dict[str, bool]:
        """Whether each given argument of a call to the gold API is right, by the rule of :meth:`is_correct`."""
        return {}

    def gold_api(self, example: Example) -> str | None:
        """The API the gold call names; None where there is no gold call."""
        return None

    def call_expected(self, example: Example) -> bool | None:
        """Where the label asks only whether a call is made, whether one is expected; None where a gold call
        is checked."""
        return None


NO_GOLD = Labels()


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation before the call to make (a gate's chat, a multi-turn data set's step): a user's
    text, the assistant's text and tool calls, or a tool's result."""

    role: str  # "user", "assistant" or "tool"
    text: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()  # the assistant's calls: (function name, arguments)


@dataclass(frozen=True)
class Conversation:
    """What a prompt shows besides the query when the call to make is a step of a conversation: a system text of
    its own and every turn (the last user turn, the query, included), in order (:mod:`mice_exp.llm.prompt`)."""

    system: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Example:
    """One tool-calling query with its allowed tools and gold call.

    ``labels`` is the data set's labelling rule (:mod:`mice_exp.data.labels`); ``api`` is the stratum for
    splits and leave-one-API-out (STE: gold API; BFCL: category; jsonl: its ``api`` field). A step of a multi-turn
    conversation carries the turns before it in ``conversation`` (its last user turn's text is ``query``).
    """

    id: str  # stable, unique: "<dataset>/<api>/<index>"; a conversation's step: "<conversation>/<turn>/<step>"
    dataset: str  # the data set's name, as records and reports show it
    api: str
    query: str
    tools: str  # tool descriptions exactly as shown in the prompt
    tool_names: tuple[str, ...]  # names allowed after "Action:"
    gold: Any  # dataset-specific gold (JSON-serialisable), read only by ``labels``
    demo: str  # the gold call as a demonstration: 'Action: <api>\nAction Input: <json>' (BFCL's irrelevance:
    #            a reply with no call); "" when the example cannot serve as one (kept out of the demo pool)
    labels: Labels = field(default=NO_GOLD, compare=False, repr=False)
    conversation: Conversation | None = None  # the turns before this call, where it is a conversation's step

    @property
    def conversation_id(self) -> str | None:
        """The conversation a step belongs to (its id less ``/<turn>/<step>``): what whole-trajectory scores group
        by; None for a single-turn query."""
        return self.id.rsplit("/", 2)[0] if self.conversation is not None else None

    @cached_property
    def schemas(self) -> list[Schema]:
        """The tools as OpenAI-style function schemas (:mod:`mice_exp.data.schemas`), converted once, when a
        prompt first shows them (``prompt.tools=schemas``); ``tools`` stays the one stored form."""
        return tool_schemas(self.tools, f"example {self.id}")

    def row(self) -> dict[str, Any]:
        """The example as a JSON object (a gate's demonstration pool, which shows single queries); the labelling
        rule is code, not data."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("labels", "conversation")}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Example:
        """An example :meth:`row` wrote, without gold labels (a gate shows it as a demonstration only)."""
        return cls(**{**row, "tool_names": tuple(row["tool_names"])})

    @classmethod
    def unlabelled(cls, index: int, query: str, tools: str, tool_names: tuple[str, ...]) -> Example:
        """A query whose right call is unknown (a gate's): no gold, no demonstration."""
        return cls(id=f"gate/{index}", dataset="gate", api="gate", query=query, tools=tools, tool_names=tool_names,
                   gold=None, demo="")


def format_demo(action: str, action_input: str | dict[str, Any]) -> str:
    """Render a gold call in STE's ``Action`` / ``Action Input`` format.

    A string ``action_input`` is kept verbatim so STE demonstrations look exactly as in
    STE; a dict is written as compact JSON.
    """
    if not isinstance(action_input, str):
        action_input = json.dumps(action_input, ensure_ascii=False)
    return f"Action: {action}\nAction Input: {action_input}"


def demo_declines(demo: str) -> bool:
    """Whether a demonstration's reply makes no call (BFCL's irrelevance replies): every call is written by
    :func:`format_demo`; ``""`` (no demonstration) neither calls nor declines."""
    return bool(demo) and not demo.startswith("Action: ")
