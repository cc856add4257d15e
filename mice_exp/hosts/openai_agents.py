"""The gate inside the OpenAI Agents SDK: each call the agent's model proposes is scored before its tool runs.

What the SDK hands each hook (read in ``agents`` 0.24's code): a tool input guardrail gets a ``ToolContext``
(the call's name, arguments and id, and ``turn_input``, the run's original input only: not the system
prompt, nor the calls and tool results made earlier in this run) and the agent; a ``needs_approval``
callable gets the run context, the parsed arguments and the call id, without the agent or the tools. Neither
sees the conversation the model answered. The run hooks' ``on_llm_start`` does (the instructions and every
input item sent to the model) and ``on_llm_end`` gets the model's response before any tool runs, so
:class:`GateGuard` scores there, with the whole conversation and the agent's function tools, and the
guardrail or the approval only looks the verdict up by the call's id::

    guard = GateGuard(Gate.load("gate/"))                     # or GateGuard("http://127.0.0.1:8000")
    @function_tool(tool_input_guardrails=[guard.guardrail])   # a held call is not run; the model is told why
    def get_weather(city: str) -> str: ...
    @function_tool(needs_approval=guard.needs_approval)       # a held call interrupts the run for a person
    def send_money(to: str, amount: float) -> str: ...
    Runner.run_sync(agent, "...", hooks=guard.hooks)

A run without ``hooks=guard.hooks`` is refused at its first guarded call (the guard has not seen the call).
An MCP server's tools (``MCPServerStdio(...)`` and the like) are function tools too: the guard hands the gate
their MCP annotations, so (over HTTP or in-process alike) ``readOnlyHint`` decides at the low-risk tau and
``destructiveHint`` at the high-risk one; ``MCPServerStdio(..., tool_input_guardrails=[guard.guardrail])``
blocks a held call of any of the server's tools.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunHooks, ToolGuardrailFunctionOutput, ToolInputGuardrail
from agents.items import ModelResponse, TResponseInputItem
from agents.models.chatcmpl_converter import Converter
from agents.tool_guardrails import ToolInputGuardrailData

from mice_exp.errors import UserError
from mice_exp.hosts.scoring import TIMEOUT, Verdict, annotated, scorer, tool_call


class GateGuard:
    """Scores the agent's proposed calls with a gate (a loaded ``Gate``, or the URL of ``mice-exp serve``) and
    holds those at or below ``tau`` (default: the gate's own risk setting); a gate that gives no verdict within
    ``timeout`` seconds holds every call, unless ``fail_open``."""

    def __init__(self, gate: Any, *, tau: float | None = None, timeout: float = TIMEOUT,
                 fail_open: bool = False) -> None:
        self.scorer = scorer(gate, tau, timeout=timeout, fail_open=fail_open)
        self.verdicts = self.scorer.verdicts  # by call id; kept so a resumed run finds an approved call's verdict
        self.hooks = _ScoreProposedCalls(self)
        self.guardrail: ToolInputGuardrail[Any] = ToolInputGuardrail(self._block, name="mice_exp_gate")

    def verdict(self, call_id: str) -> Verdict:
        """The gate's verdict on the call with this id."""
        try:
            return self.verdicts[call_id]
        except KeyError:
            raise UserError(f"the gate has not seen tool call {call_id!r}; pass hooks=guard.hooks to Runner.run, "
                            "run_sync or run_streamed so the guard scores each call the model proposes") from None

    def _block(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        verdict = self.verdict(data.context.tool_call_id)
        if verdict.execute:
            return ToolGuardrailFunctionOutput.allow(output_info=verdict)
        return ToolGuardrailFunctionOutput.reject_content(verdict.refusal(), output_info=verdict)

    async def needs_approval(self, context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str) -> bool:
        """For ``needs_approval=``: a held call interrupts the run (``result.interruptions``) until approved."""
        return not self.verdict(call_id).execute


class _ScoreProposedCalls(RunHooks[Any]):
    """Remembers what the model was sent and scores the calls in its response before any tool runs."""

    def __init__(self, guard: GateGuard) -> None:
        self.guard = guard
        self._sent: dict[int, list[dict[str, Any]]] = {}  # by run context: one model call at a time per run

    async def on_llm_start(self, context: RunContextWrapper[Any], agent: Any, system_prompt: str | None,
                           input_items: list[TResponseInputItem]) -> None:
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self._sent[id(context)] = system + list(Converter.items_to_messages(input_items))

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Any, response: ModelResponse) -> None:
        messages = self._sent.pop(id(context))
        calls = [tool_call(item.call_id, item.name, item.arguments) for item in response.output
                 if getattr(item, "type", None) == "function_call"]
        if not calls:
            return
        tools = [openai_tool(t) for t in await agent.get_all_tools(context) if isinstance(t, FunctionTool)]
        await asyncio.to_thread(self.guard.scorer.score_calls, messages, tools, calls)


def openai_tool(tool: FunctionTool) -> dict[str, Any]:
    """The tool as OpenAI's chat schema, with an MCP tool's annotations (what sets its tau)."""
    return annotated(Converter.tool_to_openai(tool), tool.mcp_annotations)
