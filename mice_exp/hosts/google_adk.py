"""The gate inside a Google ADK agent: ``LlmAgent(before_tool_callback=guard.before_tool)`` scores each call the
agent's model proposes before its tool runs.

What ADK hands the callback (read in ``google-adk`` 2.13's code): the tool (its declaration: name, description,
parameters), the parsed arguments and a ``ToolContext`` (the call's ``function_call_id``, the session with
its events: the user's turns, the model's ``function_call`` parts and the ``function_response`` parts of the
tools that ran). A dict it returns is used as the tool's result and the tool does not run. So
:class:`GateCallback` rebuilds the conversation from the session's events, scores the call with every tool
of the agent it is given (``tools=``; else the called tool alone), and for a held call returns the gate's
reason as the tool's result (the model reads why); with ``confirm=True`` it asks the user instead through
ADK's Tool Confirmation (``tool_context.request_confirmation``: the run pauses on an
``adk_request_confirmation`` call; the user's ``ToolConfirmation(confirmed=...)`` answer resumes it, and the
call runs or is refused)::

    guard = GateCallback("http://127.0.0.1:8000", confirm=True)   # or a loaded Gate
    agent = LlmAgent(name="assistant", model=..., tools=[book_table], before_tool_callback=guard.before_tool)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Sequence

from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext

from mice_exp.hosts.scoring import TIMEOUT, Verdict, schema_of_call, scorer, tool_call, tool_schema


class GateCallback:
    """``before_tool_callback`` for an ADK agent: a call at or below ``tau`` (default: the gate's risk setting)
    is refused with the gate's reason, or, with ``confirm``, waits for the user's Tool Confirmation; a gate that
    gives no verdict within ``timeout`` seconds refuses every call, unless ``fail_open``."""

    def __init__(self, gate: Any, *, tools: Sequence[BaseTool] = (), tau: float | None = None,
                 timeout: float = TIMEOUT, fail_open: bool = False, confirm: bool = False) -> None:
        self.scorer = scorer(gate, tau, timeout=timeout, fail_open=fail_open)
        self.tools, self.confirm = list(tools), confirm

    async def before_tool(self, tool: BaseTool, args: dict[str, Any], tool_context: ToolContext
                          ) -> dict[str, Any] | None:
        """None: the tool runs; a dict: the tool's result in its place (the reason it did not run)."""
        verdict = await asyncio.to_thread(self.verdict, tool, args, tool_context)
        if verdict.decision == "allow":
            return None
        if not (self.confirm and verdict.decision == "ask"):
            return {"error": verdict.refusal()}
        answer = tool_context.tool_confirmation
        if answer is None:
            tool_context.request_confirmation(hint=verdict.explain(), payload={"mice_exp": verdict.as_dict()})
            return {"error": f"{verdict.explain()} Waiting for the user to confirm the call."}
        return None if answer.confirmed else {"error": f"{verdict.explain()} The user refused the call."}

    def verdict(self, tool: BaseTool, args: dict[str, Any], tool_context: ToolContext) -> Verdict:
        """The gate's verdict on the call, with the session's conversation and the agent's tools."""
        tools = [declared(t) for t in self.tools if t.name != tool.name]
        tools.append(declared(tool) if tool._get_declaration() is not None else schema_of_call(tool.name, args))
        call = tool_call(tool_context.function_call_id or tool.name, tool.name, args)
        (verdict,) = self.scorer.score_calls(conversation(tool_context, call["id"]), tools, [call])
        return verdict


def declared(tool: BaseTool) -> dict[str, Any]:
    """A tool's ADK declaration as OpenAI's chat schema (its JSON schema, as Gemini is sent it)."""
    declaration = tool._get_declaration()
    if declaration.parameters_json_schema is not None:
        parameters = declaration.parameters_json_schema
    elif declaration.parameters is not None:
        parameters = declaration.parameters.json_schema.model_dump(mode="json", exclude_none=True)
    else:
        parameters = {"type": "object", "properties": {}}
    return tool_schema(declaration.name, declaration.description, parameters)


def conversation(tool_context: ToolContext, call_id: str) -> list[dict[str, Any]]:
    """The session's events in OpenAI's chat shapes, up to the model reply that proposed ``call_id``."""
    messages: list[dict[str, Any]] = []
    instruction = getattr(tool_context, "_invocation_context").agent.instruction
    if isinstance(instruction, str) and instruction:
        messages.append({"role": "system", "content": instruction})
    for event in tool_context.session.events:
        parts = [p for p in (event.content.parts or []) if not _own(p)] if event.content is not None else []
        calls = [p.function_call for p in parts if p.function_call is not None]
        if any(c.id == call_id for c in calls):
            break
        text = "".join(p.text for p in parts if p.text and not p.thought)
        if event.content is not None and event.content.role == "model":
            if text or calls:
                messages.append({"role": "assistant", "content": text or None, **({"tool_calls": [
                    tool_call(c.id or c.name, c.name, c.args or {}) for c in calls]} if calls else {})})
            continue
        messages += [{"role": "tool", "tool_call_id": p.function_response.id or p.function_response.name,
                      "content": _text(p.function_response.response)} for p in parts if p.function_response]
        if text:
            messages.append({"role": "user", "content": text})
    return messages


def _own(part: Any) -> bool:
    """A part of ADK's own (``adk_request_confirmation`` and its answer), which the agent's model never saw."""
    named = part.function_call or part.function_response
    return named is not None and (named.name or "").startswith("adk_")


def _text(response: Any) -> str:
    """A function response as the text a chat model reads (ADK wraps a plain result as ``{"result": ...}``)."""
    if isinstance(response, dict) and set(response) == {"result"}:
        response = response["result"]
    return response if isinstance(response, str) else json.dumps(response, ensure_ascii=False, default=str)
