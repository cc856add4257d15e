"""The gate in front of an MCP server: :class:`GateProxy` is an MCP server that serves another server's tools
and asks the gate before each ``tools/call`` it forwards.

What a ``tools/call`` carries (the installed ``mcp`` package's ``CallToolRequestParams``): the tool's name and
arguments, no conversation and no call id. So the gate is shown what the proxy's owner says the agent is
doing (``task``), every upstream tool as OpenAI's schema with its MCP ``annotations`` (``readOnlyHint``
decides at the low-risk tau, ``destructiveHint`` at the high-risk one), and the call;
a call is known by its name and arguments, so the same call gets the same verdict.

A call the gate trusts is forwarded and its result returned as the upstream server gave it; a call it denies
is an error result the model reads (``isError``, the gate's reason). A call it doubts is asked about: on a
2026-07-28 connection the proxy returns ``input_required`` with an elicitation (the client asks its user, and
its retry carries the answer; "accept" forwards the call), on an older one a held error result saying why::

    async with Client(StdioServerParameters(command="python", args=["server.py"])) as upstream:
        proxy = GateProxy(upstream, "http://127.0.0.1:8000", task="Book a table for two in Paris.")
        async with Client(proxy.server, elicitation_callback=ask_the_user) as client:
            await client.call_tool("book_table", {"city": "Paris", "people": 2})
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mice_exp.hosts.scoring import TIMEOUT, Verdict, scorer, tool_call, tool_schema

#: The key of the proxy's one input request: "may this held call run?"
CONFIRM = "mice_exp_confirm"


class GateProxy:
    """Serves ``upstream``'s tools (an entered ``mcp.Client``) as ``self.server``, guarded by a gate (a loaded
    ``Gate``, or the URL of ``mice-exp serve``) at ``tau`` (default: each tool's risk, else the gate's);
    a gate that gives no verdict within ``timeout`` seconds denies, unless ``fail_open``."""

    def __init__(self, upstream: Client, gate: Any, *, task: str, tau: float | None = None,
                 timeout: float = TIMEOUT, fail_open: bool = False, name: str = "mice-exp-gate") -> None:
        self.upstream, self.task = upstream, task
        self.scorer = scorer(gate, tau, timeout=timeout, fail_open=fail_open)
        self.server = Server(name, on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        self._tools: list[types.Tool] | None = None

    async def tools(self) -> list[types.Tool]:
        """The upstream server's tools, listed once."""
        if self._tools is None:
            self._tools = list((await self.upstream.list_tools()).tools)
        return self._tools

    async def verdict(self, name: str, arguments: dict[str, Any]) -> Verdict:
        """The gate's verdict on one call, with the task and every upstream tool as its context."""
        tools = [tool_schema(t.name, t.description, t.input_schema, t.annotations) for t in await self.tools()]
        digest = hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:16]
        call = tool_call(f"mcp_{name}_{digest}", name, arguments)
        (verdict,) = await asyncio.to_thread(self.scorer.score_calls, [{"role": "user", "content": self.task}],
                                             tools, [call])
        return verdict

    async def _list_tools(self, ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=await self.tools())

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                         ) -> types.CallToolResult | types.InputRequiredResult:
        arguments = params.arguments or {}
        verdict = await self.verdict(params.name, arguments)
        answer = (params.input_responses or {}).get(CONFIRM)
        if verdict.decision == "allow" or (verdict.decision == "ask" and params.request_state == verdict.call_id
                                           and isinstance(answer, types.ElicitResult) and answer.action == "accept"):
            return await self.upstream.call_tool(params.name, arguments)
        if verdict.decision == "ask" and answer is None and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            question = types.ElicitRequest(params=types.ElicitRequestFormParams(
                message=f"{verdict.explain()} Run it as it stands?",
                requested_schema={"type": "object", "properties": {}}))
            return types.InputRequiredResult(input_requests={CONFIRM: question}, request_state=verdict.call_id)
        why = verdict.refusal() if answer is None else f"{verdict.explain()} The user declined it; it was not run."
        return types.CallToolResult(content=[types.TextContent(type="text", text=why)], is_error=True)
