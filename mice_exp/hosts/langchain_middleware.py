"""The gate inside a LangChain 1.x agent (``create_agent``): each call the agent's model proposes is scored before
its tool runs.

What LangChain's hooks see (read in ``langchain`` 1.5's code): ``wrap_model_call`` gets the model request (the
system message, every message of the conversation, the tools offered) and the model's reply, so
:class:`GateMiddleware` scores there and writes each call's verdict into the reply
(``AIMessage.response_metadata["mice_exp"][call id]``), where it stays in the agent's state and checkpoints.
``wrap_tool_call`` then blocks a held call: the tool does not run and the model gets a ``ToolMessage``
(status "error") saying why. ``HumanInTheLoopMiddleware``'s per-tool ``when`` predicate sees the agent state
with its messages (in its default batched mode, without the tool), so :meth:`GateMiddleware.review` builds one
that interrupts for exactly the held calls, showing the reviewer the gate's probability::

    guard = GateMiddleware(Gate.load("gate/"))                # or GateMiddleware("http://127.0.0.1:8000")
    agent = create_agent(model, tools, middleware=[guard])   # held calls blocked
    agent = create_agent(model, tools, middleware=[guard, guard.review(tools)], checkpointer=InMemorySaver())
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Sequence

from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware, ModelRequest, ModelResponse
from langchain.agents.middleware.human_in_the_loop import DecisionType
from langchain_core.messages import AIMessage, ToolCall, ToolMessage, convert_to_openai_messages
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from mice_exp.errors import UserError
from mice_exp.hosts.scoring import TIMEOUT, Verdict, scorer, tool_call

#: Where a reply carries the gate's verdicts: ``AIMessage.response_metadata[KEY][call id]``.
KEY = "mice_exp"


class GateMiddleware(AgentMiddleware):
    """Scores the agent's proposed calls with a gate (a loaded ``Gate``, or the URL of ``mice-exp serve``) and
    blocks those at or below ``tau`` (default: the gate's own risk setting), except the tools handed to
    :meth:`review`, whose held calls wait for a person instead; a gate that gives no verdict within ``timeout``
    seconds blocks every call, unless ``fail_open``."""

    def __init__(self, gate: Any, *, tau: float | None = None, timeout: float = TIMEOUT,
                 fail_open: bool = False) -> None:
        super().__init__()
        self.scorer = scorer(gate, tau, timeout=timeout, fail_open=fail_open)
        self.reviewed: set[str] = set()

    # ------------------------------------------------------------------ scoring the model's reply
    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        response = handler(request)
        self._score(request, response)
        return response

    async def awrap_model_call(self, request: ModelRequest,
                               handler: Callable[[ModelRequest], Awaitable[ModelResponse]]) -> ModelResponse:
        response = await handler(request)
        await asyncio.to_thread(self._score, request, response)
        return response

    def _score(self, request: ModelRequest, response: ModelResponse) -> None:
        system = [request.system_message] if request.system_message is not None else []
        messages = convert_to_openai_messages([*system, *request.messages])
        tools = [convert_to_openai_tool(t) for t in request.tools]
        for reply in response.result:
            if isinstance(reply, AIMessage) and reply.tool_calls:
                calls = [tool_call(c["id"], c["name"], c["args"]) for c in reply.tool_calls]
                verdicts = self.scorer.score_calls(messages, tools, calls)
                reply.response_metadata[KEY] = {v.call_id: v.as_dict() for v in verdicts}

    # ------------------------------------------------------------------ acting on the verdicts
    def wrap_tool_call(self, request: ToolCallRequest,
                       handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]) -> ToolMessage | Command[Any]:
        return self._blocked(request) or handler(request)

    async def awrap_tool_call(self, request: ToolCallRequest,
                              handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
                              ) -> ToolMessage | Command[Any]:
        return self._blocked(request) or await handler(request)

    def _blocked(self, request: ToolCallRequest) -> ToolMessage | None:
        call = request.tool_call
        if call["name"] in self.reviewed:
            return None  # a person decided (HumanInTheLoopMiddleware removed a rejected call before this)
        verdict = verdict_of(request.state, call)
        if verdict.execute:
            return None
        return ToolMessage(content=verdict.refusal(), name=call["name"], tool_call_id=call["id"], status="error")

    def held(self, request: ToolCallRequest) -> bool:
        """``HumanInTheLoopMiddleware``'s ``when`` predicate: interrupt for the calls the gate held."""
        return not verdict_of(request.state, request.tool_call).execute

    def review(self, tools: Sequence[BaseTool | dict[str, Any] | Callable[..., Any]],
               allowed_decisions: Sequence[DecisionType] = ("approve", "reject")) -> HumanInTheLoopMiddleware:
        """A ``HumanInTheLoopMiddleware`` that asks a person about these tools' held calls (the agent then needs a
        checkpointer); this guard stops blocking them. Put it after the guard in ``middleware=[...]``."""
        names = [convert_to_openai_tool(t)["function"]["name"] for t in tools]
        self.reviewed.update(names)
        config = {"allowed_decisions": list(allowed_decisions), "when": self.held, "description": _describe}
        return HumanInTheLoopMiddleware(interrupt_on={name: dict(config) for name in names})


def verdict_of(state: Any, call: ToolCall) -> Verdict:
    """The verdict the guard wrote for ``call`` into the reply that proposed it."""
    for message in reversed(state["messages"]):
        if isinstance(message, AIMessage) and call["id"] in message.response_metadata.get(KEY, {}):
            return Verdict(**message.response_metadata[KEY][call["id"]])
    raise UserError(f"the gate has not scored tool call {call['id']!r} ({call['name']}); expected GateMiddleware "
                    "in create_agent(middleware=[...]) before any middleware that changes the model's reply")


def _describe(call: ToolCall, state: Any, runtime: Any) -> str:
    """What the reviewer reads: the call and the gate's view of it."""
    return f"{call['name']}({call['args']}): {verdict_of(state, call).explain()}"
