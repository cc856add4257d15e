"""The one record type every loader produces, so later stages never see dataset formats."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from mice_exp.data.schemas import Schema, tool_schemas


@dataclass(frozen=True)
class Example:
    """One tool-calling query with its allowed tools and gold call.

    ``dataset`` selects the labeler (see :mod:`mice_exp.data.labels`); ``api`` is the
    stratum for splits and leave-one-API-out (STE: gold API; BFCL: category; jsonl: its
    ``api`` field).
    """

    id: str  # stable, unique: "<dataset>/<api>/<index>"
    dataset: str  # "ste" | "bfcl" | "jsonl"
    api: str
    query: str
    tools: str  # tool descriptions exactly as shown in the prompt
    tool_names: tuple[str, ...]  # names allowed after "Action:"
    gold: Any  # dataset-specific gold (JSON-serialisable)
    demo: str  # the gold call as a demonstration: 'Action: <api>\nAction Input: <json>' (BFCL's irrelevance:
    #            a reply with no call); "" when the example cannot serve as one (kept out of the demo pool)

    @cached_property
    def schemas(self) -> list[Schema]:
        """The tools as OpenAI-style function schemas (:mod:`mice_exp.data.schemas`), converted once, when a
        prompt first shows them (``prompt.tools=schemas``); ``tools`` stays the one stored form."""
        return tool_schemas(self.tools, f"example {self.id}")


def format_demo(action: str, action_input: str | dict[str, Any]) -> str:
    """Render a gold call in STE's ``Action`` / ``Action Input`` format.

    A string ``action_input`` is kept verbatim so STE demonstrations look exactly as in
    STE; a dict is written as compact JSON.
    """
    if not isinstance(action_input, str):
        action_input = json.dumps(action_input, ensure_ascii=False)
    return f"Action: {action}\nAction Input: {action_input}"
