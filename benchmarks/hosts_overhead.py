"""What each host adapter adds per guarded call, against a stand-in gate on 127.0.0.1 (tests/stand_in_gate.py:
a fixed verdict at once), so the figure is the adapter's own work and one loopback HTTP round trip, not the
gate's LLM (benchmarks/gate_latency.py measures that).

Per adapter: N calls, each with a new id (a cached id costs a dict look-up), through the adapter's own entry
point: ``Guarded.score_calls`` (what GateGuard and GateMiddleware call from their hooks), ``GateHook.decide``
(the Claude hook, in-process; the ``mice-exp claude-hook`` command adds a Python start per call, timed
separately), ``gate_approver`` (Inspect, awaited as Inspect awaits it), an ADK ``Runner`` loop of one call
with ``GateCallback`` beside the same loop unguarded, and a
``tools/call`` through ``GateProxy`` (MCP, in-process client and upstream) beside the same call made
upstream directly. Wall and CPU time of this process (the stand-in's thread included), the CPU model and the
load average before and after::

    python benchmarks/hosts_overhead.py [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mice_exp.hosts.scoring import scorer, tool_call  # noqa: E402
from tests.stand_in_gate import StandInGate  # noqa: E402

QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Today's weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}


def timed(n: int, one: Callable[[int], Any]) -> tuple[float, float]:
    """Milliseconds of wall and CPU time per call of ``one(i)``, over ``n`` calls after one warm-up."""
    one(-1)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        one(i)
    return (time.perf_counter() - wall) * 1e3 / n, (time.process_time() - cpu) * 1e3 / n


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return f"{model}, {os.cpu_count()} cores, nice {os.nice(0)}, Python {platform.python_version()}"


def scoring(url: str) -> Callable[[int], Any]:
    guard = scorer(url)
    return lambda i: guard.score_calls(QUESTION, [WEATHER], [tool_call(f"c{i}", "get_weather", {"city": "Paris"})])


def claude(url: str) -> Callable[[int], Any]:
    from mice_exp.hosts.claude_hooks import GateHook

    hook = GateHook(url, tools=[WEATHER])
    return lambda i: hook.decide({"hook_event_name": "PreToolUse", "tool_name": "get_weather",
                                  "tool_input": {"city": "Paris"}, "tool_use_id": f"toolu_{i}"})


def claude_command(url: str) -> Callable[[int], Any]:
    hook_input = '{"hook_event_name": "PreToolUse", "tool_name": "get_weather", "tool_input": {"city": "Paris"}}'
    command = [sys.executable, "-m", "mice_exp", "claude-hook", f"gate={url}"]
    return lambda i: subprocess.run(command, input=hook_input, capture_output=True, text=True, check=True, cwd=ROOT)


def inspect(url: str) -> Callable[[int], Any]:
    """The approver as Inspect awaits it, outside a sample (so the called tool's schema is made from the call)."""
    from inspect_ai.model import ChatMessageUser
    from inspect_ai.tool import ToolCall, ToolCallView

    from mice_exp.hosts.inspect_approver import gate_approver

    approve, loop = gate_approver(url), asyncio.new_event_loop()
    history = [ChatMessageUser(content=QUESTION[0]["content"])]
    return lambda i: loop.run_until_complete(approve("", ToolCall(id=f"c{i}", function="get_weather", arguments={
        "city": "Paris"}), ToolCallView(), history))


def adk(url: str, guarded: bool) -> Callable[[int], Any]:
    """One ADK Runner loop per step (the scripted model proposes one call, then answers), with the gate's
    before_tool_callback or none: the difference is what guarding one call adds."""
    from google.adk.agents import LlmAgent
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    from mice_exp.hosts.google_adk import GateCallback
    from tests.scripted_adk import ScriptedLlm

    def get_weather(city: str) -> str:
        """Today's weather in a city."""
        return f"Sunny in {city}"

    loop, question = asyncio.new_event_loop(), types.Content(role="user", parts=[types.Part(text="Weather?")])

    async def run() -> None:
        model = ScriptedLlm(model="scripted", script=[("call", "get_weather", {"city": "Paris"}), ("answer", "Sunny.")])
        agent = LlmAgent(name="assistant", model=model, tools=[get_weather],
                         before_tool_callback=GateCallback(url).before_tool if guarded else None)
        runner = InMemoryRunner(agent=agent, app_name="bench")
        session = await runner.session_service.create_session(app_name="bench", user_id="u")
        async for _ in runner.run_async(user_id="u", session_id=session.id, new_message=question):
            pass

    return lambda i: loop.run_until_complete(run())


def mcp(url: str, guarded: bool) -> Callable[[int], Any]:
    """One ``tools/call`` per step, through GateProxy or straight to the upstream server, on one event loop."""
    from mcp import Client

    from mice_exp.hosts.mcp_proxy import GateProxy
    from tests import mcp_tools

    loop = asyncio.new_event_loop()
    upstream = loop.run_until_complete(Client(mcp_tools.shop).__aenter__())
    client = upstream
    if guarded:
        proxy = GateProxy(upstream, url, task="Weather in Paris?")
        client = loop.run_until_complete(Client(proxy.server).__aenter__())
    return lambda i: loop.run_until_complete(client.call_tool("get_weather", {"city": f"Paris {i}"}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(f"# {machine()}; load average before: {os.getloadavg()}")
    with StandInGate() as gate:
        cases: dict[str, Callable[[], Callable[[int], Any]]] = {
            "Guarded.score_calls (Agents SDK, LangChain)": lambda: scoring(gate.url),
            "Claude GateHook.decide": lambda: claude(gate.url),
            "Inspect gate_approver": lambda: inspect(gate.url),
            "ADK Runner loop, one call, unguarded": lambda: adk(gate.url, guarded=False),
            "ADK Runner loop, one call, GateCallback": lambda: adk(gate.url, guarded=True),
            "MCP tools/call, upstream directly": lambda: mcp(gate.url, guarded=False),
            "MCP tools/call through GateProxy": lambda: mcp(gate.url, guarded=True)}
        for name, make in cases.items():
            try:
                one = make()
            except ImportError as error:
                print(f"{name}: skipped ({error})")
                continue
            wall, cpu = timed(args.calls, one)
            print(f"{name}: {wall:.2f} ms wall, {cpu:.2f} ms CPU per call ({args.calls} calls)")
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall, _ = timed(3, claude_command(gate.url))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime) * 1e3 / 4
        print(f"mice-exp claude-hook command (a Python process per call): {wall:.0f} ms wall, {cpu:.0f} ms CPU per "
              "call (3 calls)")
    print(f"# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
