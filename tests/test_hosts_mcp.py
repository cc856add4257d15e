"""The gate in front of MCP tools, with the installed ``mcp`` package's client and server: ``GateProxy`` serves
tests/mcp_tools.py's tools in-process and asks the gate before each ``tools/call``; the Agents SDK's MCP path
(``MCPServerStdio``, the same tools over stdio) hands the gate each tool's annotations.

The proxy's three answers (forward, refuse, ask) are shown with a stand-in gate that decides per tool
(tests/stand_in_gate.py: the tiny test gate's probabilities are 0 or 1, so it cannot be made to doubt one
call and trust another); what the real gate makes of the annotations runs against test_hosts' served gate.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys

import pytest

pytest.importorskip("mcp", reason="the MCP host needs the mcp package (the hosts extra)")

import mcp_types as types  # noqa: E402
from agents import Agent, OpenAIChatCompletionsModel, Runner  # noqa: E402
from agents.mcp import MCPServerStdio  # noqa: E402
from mcp import Client  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from mice_exp.hosts.mcp_proxy import GateProxy  # noqa: E402
from mice_exp.hosts.openai_agents import GateGuard  # noqa: E402
from mice_exp.paths import PACKAGE_ROOT  # noqa: E402
from tests import mcp_tools  # noqa: E402
from tests.doc_blocks import code_blocks, run_block  # noqa: E402
from tests.scripted_model import ScriptedModel  # noqa: E402
from tests.stand_in_gate import TIMEOUT, StandInGate, unavailable  # noqa: E402, F401 - unavailable: a fixture
from tests.test_gate import fitted  # noqa: E402, F401 - test_gate's saved tiny_random gate
from tests.test_hosts import gate, served  # noqa: E402, F401 - the gate loaded from it, and mice-exp serve on it

pytestmark = pytest.mark.timeout(300)
TASK = "Book a table for two in Paris and tell me the weather there."
CALLS = [("get_weather", {"city": "Paris"}), ("cancel_booking", {"booking": "b-7"}),
         ("book_table", {"city": "Paris", "people": 2})]


def through_the_proxy(gate: str, calls=CALLS, answer: str = "accept", mode: str = "auto", **guarding):
    """Each call sent through a GateProxy over tests.mcp_tools' server (the client's user answers the gate's
    question with ``answer``): the tools the client was listed, each result, the questions asked, what ran."""
    asked: list[str] = []

    async def user(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action=answer)

    async def session():
        async with Client(mcp_tools.shop) as upstream:
            proxy = GateProxy(upstream, gate, task=TASK, **guarding)
            async with Client(proxy.server, mode=mode, elicitation_callback=user) as client:
                listed = (await client.list_tools()).tools
                return listed, [await client.call_tool(name, arguments) for name, arguments in calls]

    mcp_tools.RAN.clear()
    listed, results = asyncio.run(session())
    return listed, results, asked, list(mcp_tools.RAN)


def text(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content)


def test_the_proxy_forwards_what_the_gate_trusts_refuses_what_it_denies_and_asks_about_the_rest():
    decisions = {"get_weather": "allow", "cancel_booking": "deny", "book_table": "ask"}
    with StandInGate(decision=decisions, probability=0.42) as stand_in:
        listed, (weather, cancel, book), asked, ran = through_the_proxy(stand_in.url)
    assert [t.name for t in listed] == ["get_weather", "cancel_booking", "book_table"]  # the upstream's tools
    assert ran == ["get_weather", "book_table"]
    assert text(weather) == "Sunny in Paris" and not weather.is_error
    assert cancel.is_error and text(cancel).startswith("The confidence gate refused the call to cancel_booking (42%)")
    (question,) = asked  # input_required: the client asked its user, and its retry said "accept"
    assert "a 42% chance of being right" in question and text(book) == "Booked for 2 in Paris"
    request = stand_in.requests[0]
    assert request["messages"] == [{"role": "user", "content": TASK}]
    assert {t["function"]["name"]: t.get("annotations") for t in request["tools"]} == {
        "get_weather": {"readOnlyHint": True}, "cancel_booking": {"destructiveHint": True}, "book_table": None}


def test_a_call_the_user_declines_does_not_run():
    with StandInGate(decision="ask") as stand_in:
        _, (book,), asked, ran = through_the_proxy(stand_in.url, CALLS[2:], answer="decline")
    assert len(asked) == 1 and ran == [] and book.is_error and "The user declined it" in text(book)


def test_an_older_client_gets_a_held_result_instead_of_a_question():
    with StandInGate(decision="ask") as stand_in:
        _, (book,), asked, ran = through_the_proxy(stand_in.url, CALLS[2:], mode="legacy")
    assert asked == [] and ran == [] and book.is_error and "The tool was not run" in text(book)


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail-closed", "fail-open"])
def test_the_proxy_runs_no_call_when_the_gate_gives_no_verdict_unless_told_to_fail_open(unavailable, fail_open):
    _, results, asked, ran = through_the_proxy(unavailable, CALLS[:1], timeout=TIMEOUT, fail_open=fail_open)
    assert asked == [] and ran == (["get_weather"] if fail_open else [])
    assert results[0].is_error != fail_open
    assert fail_open or "fail-closed" in text(results[0])


def test_each_tools_annotations_set_its_tau_through_the_proxy_and_the_agents_sdk(gate, served):  # noqa: F811
    """readOnlyHint: the low-risk tau (0.1); destructiveHint: the high-risk one (0.9); no hint: the gate's. Over
    HTTP and with the gate loaded in this process alike, each call at the same tau with the same decision."""
    taus = {"get_weather": 0.1, "cancel_booking": 0.9, "book_table": gate.tau}

    async def proxied(where):
        async with Client(mcp_tools.shop) as upstream:
            proxy = GateProxy(upstream, where, task=TASK)
            return {name: await proxy.verdict(name, arguments) for name, arguments in CALLS}

    script = [("call", name, arguments) for name, arguments in CALLS] + [("answer", "Done.")]

    async def agent_run(guard: GateGuard, url: str):
        params = {"command": sys.executable, "args": ["-m", "tests.mcp_tools"], "cwd": str(PACKAGE_ROOT)}
        async with MCPServerStdio(params, client_session_timeout_seconds=120,
                                  tool_input_guardrails=[guard.guardrail]) as shop:
            agent = Agent(name="assistant", mcp_servers=[shop], model=OpenAIChatCompletionsModel(
                "scripted", AsyncOpenAI(base_url=url, api_key="-")))
            return await Runner.run(agent, TASK, hooks=guard.hooks)

    found = {}
    for where in (served.url, gate):
        guard = GateGuard(where)
        with ScriptedModel(script) as model:
            asyncio.run(agent_run(guard, model.url))
        found[where is gate] = {"proxy": asyncio.run(proxied(where)),
                                "Agents SDK": {v.name: v for v in guard.verdicts.values()}}
    for in_process, surfaces in found.items():
        for surface, verdicts in surfaces.items():
            assert {name: v.tau for name, v in verdicts.items()} == pytest.approx(taus), (in_process, surface)
            over_http = found[False][surface]
            assert {n: v.execute for n, v in verdicts.items()} == {n: v.execute for n, v in over_http.items()}
            assert {n: v.probability for n, v in verdicts.items()} == pytest.approx(
                {n: v.probability for n, v in over_http.items()}, abs=1e-6), (in_process, surface)


# ---------------------------------------------------------------------- docs/hosts.md
@pytest.fixture
def server_py(tmp_path, monkeypatch):
    """The docs' ``python server.py``: tests/mcp_tools.py's server as a script in the working directory, and
    this interpreter first on PATH."""
    shutil.copy(mcp_tools.__file__, tmp_path / "server.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))


def test_the_docs_agents_sdk_example_runs_as_written_and_each_tool_gets_its_tau(gate, served, server_py):  # noqa: F811
    block = code_blocks("MCP")[0]
    script = [("call", name, arguments) for name, arguments in CALLS] + [("answer", "Done.")]
    with ScriptedModel(script) as model:
        namespace = {"GATE_URL": served.url,
                     "model": OpenAIChatCompletionsModel("scripted", AsyncOpenAI(base_url=model.url, api_key="-"))}
        run_block(block, namespace, "docs/hosts.md: MCP")
    assert {v.name: v.tau for v in namespace["guard"].verdicts.values()} == pytest.approx(
        {"get_weather": 0.1, "cancel_booking": 0.9, "book_table": gate.tau})
    held = [not v.execute for v in namespace["guard"].verdicts.values()]
    turns = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert ["The tool was not run" in turn for turn in turns] == held  # a held call's refusal went to the model


def test_the_docs_proxy_example_runs_as_written_and_asks_the_user_about_a_doubted_call(server_py, capsys):
    block = code_blocks("MCP")[1]
    asked: list[str] = []

    async def ask_the_user(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept")

    with StandInGate(decision="ask", probability=0.42) as stand_in:
        run_block(block, {"GATE_URL": stand_in.url, "ask_the_user": ask_the_user}, "docs/hosts.md: MCP")
    (question,) = asked
    assert "book_table a 42% chance of being right" in question and "Booked for 2 in Paris" in capsys.readouterr().out
    (request,) = stand_in.requests
    assert request["messages"] == [{"role": "user", "content": "Book a table for two in Paris."}]
    assert [t["function"]["name"] for t in request["tools"]] == ["get_weather", "cancel_booking", "book_table"]
