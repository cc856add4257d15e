"""The gate as an Inspect approver: each tool call the evaluated model proposes is approved, escalated or
rejected by the gate's calibrated probability, which turns a tool-use eval into a gated benchmark.

What Inspect hands an approver (read in ``inspect-ai`` 0.3.285's code): the assistant's message text, the
``ToolCall`` (id, function, parsed arguments), its view, and the conversation so far; not the tools' schemas,
which the approver reads from the running sample's state. The gate's answer is Inspect's: ``approve`` (the
call runs), ``escalate`` (the gate doubts it: the next approver of the policy decides, a human one for
instance) or ``reject`` (the model is told why), with the gate's view, probability included, as the
explanation every approval event of the eval log keeps::

    eval(task, approval=[ApprovalPolicy(gate_approver("http://127.0.0.1:8000"), "*")])
    eval(task, approval=[ApprovalPolicy(gate_approver(GATE_URL), "*"), ApprovalPolicy(human_approver(), "*")])
"""

from __future__ import annotations

import asyncio
from typing import Any

from inspect_ai.approval import Approval, Approver, approver
from inspect_ai.model import ChatMessage, ChatMessageAssistant, ChatMessageSystem, ChatMessageTool
from inspect_ai.tool import ToolCall, ToolCallView, ToolDef

from mice_exp.hosts.scoring import TIMEOUT, schema_of_call, scorer, tool_call, tool_schema

#: Inspect's word for each of the gate's decisions.
APPROVAL = {"allow": "approve", "ask": "escalate", "deny": "reject"}


@approver(name="mice_exp_gate")
def gate_approver(gate: Any, tau: float | None = None, timeout: float = TIMEOUT, fail_open: bool = False) -> Approver:
    """An approver that asks a gate (a loaded ``Gate``, or the URL of ``mice-exp serve``) about each call: approve
    above ``tau``, escalate at or below it, reject a call that cannot run (or no verdict within ``timeout``
    seconds, unless ``fail_open``)."""
    guard = scorer(gate, tau, timeout=timeout, fail_open=fail_open)

    async def approve(message: str, call: ToolCall, view: ToolCallView, history: list[ChatMessage]) -> Approval:
        proposed = tool_call(call.id, call.function, call.arguments)
        tools = offered() or [schema_of_call(call.function, call.arguments)]
        (verdict,) = await asyncio.to_thread(guard.score_calls, conversation(history, call.id), tools, [proposed])
        return Approval(decision=APPROVAL[verdict.decision], explanation=verdict.explain())

    return approve


def offered() -> list[dict[str, Any]]:
    """The running sample's tools as OpenAI's chat schemas (none outside a sample)."""
    from inspect_ai.solver._task_state import sample_state  # the running sample's TaskState

    state = sample_state()
    definitions = [ToolDef(t) for t in (state.tools if state is not None else [])]
    return [tool_schema(d.name, d.description, d.parameters.model_dump(exclude_none=True)) for d in definitions]


def conversation(history: list[ChatMessage], call_id: str) -> list[dict[str, Any]]:
    """The conversation in OpenAI's chat shapes, up to the reply that proposed ``call_id``."""
    messages: list[dict[str, Any]] = []
    for message in history:
        if isinstance(message, ChatMessageAssistant):
            calls = message.tool_calls or []
            if any(c.id == call_id for c in calls):
                break
            messages.append({"role": "assistant", "content": message.text or None, **({"tool_calls": [
                tool_call(c.id, c.function, c.arguments) for c in calls]} if calls else {})})
        elif isinstance(message, ChatMessageTool):
            messages.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text})
        else:
            role = "system" if isinstance(message, ChatMessageSystem) else "user"
            messages.append({"role": role, "content": message.text})
    return messages
