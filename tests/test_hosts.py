"""The gate inside the real agent frameworks (the ``hosts`` extra): the OpenAI Agents SDK's ``Runner.run_sync``
and LangChain's ``create_agent`` run a two-tool task against an OpenAI-compatible model on 127.0.0.1 (a
scripted one: it proposes fixed calls, so the flows are deterministic), with the tiny_random gate of
test_gate.py scoring each proposed call in-process.

``tau`` picks the flow: at 0 every call the gate scores runs; at 1 every call is held (a probability is never
above 1), so a held call is blocked (the model reads why) or waits for a person who approves it.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from agents import (Agent, AgentsException, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                    set_tracing_disabled)
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from openai import AsyncOpenAI

from mice_exp.errors import UserError
from mice_exp.gate import Gate
from mice_exp.gate.app import open_server
from mice_exp.hosts import GateScorer, HttpScorer, Scorer, scorer
from mice_exp.hosts.langchain_middleware import GateMiddleware
from mice_exp.hosts.openai_agents import GateGuard
from mice_exp.hosts.scoring import Verdict, tool_call
from mice_exp.paths import PACKAGE_ROOT
from tests.doc_blocks import code_blocks, run_block
from tests.scripted_model import ScriptedModel
from tests.stand_in_gate import TIMEOUT, unavailable  # noqa: F401 - unavailable: each gate that gives no verdict
from tests.test_gate import fitted  # noqa: F401 - the module's gate

pytestmark = pytest.mark.timeout(300)
set_tracing_disabled(True)  # the Agents SDK would otherwise try to export traces to OpenAI

QUESTION = "What is the date 30 days after today in Paris?"
SYSTEM = "Answer with the tools."
TASK = [("call", "get_date", {"city": "Paris"}), ("call", "add_days", {"date": "2022-09-30", "days": 30}),
        ("answer", "It is 2022-10-30.")]


@pytest.fixture(scope="module")
def gate(fitted, tiny_llm):  # noqa: F811 - the fixture imported above
    return Gate.load(fitted[0], llm=tiny_llm)


class Recording(GateScorer):
    """The in-process scorer, keeping what each host handed it."""

    def __init__(self, gate: Gate, tau: float) -> None:
        super().__init__(gate, tau)
        self.seen: list[tuple] = []

    def score_calls(self, messages, tools, calls):
        self.seen.append((messages, tools, calls))
        return super().score_calls(messages, tools, calls)


def task_tools(ran: list[str]) -> list:
    """The task's two tools, as plain functions that note each run."""

    def get_date(city: str) -> str:
        """Today's date in a city."""
        ran.append("get_date")
        return "2022-09-30"

    def add_days(date: str, days: int) -> str:
        """A date some days after another."""
        ran.append("add_days")
        return "2022-10-30"

    return [get_date, add_days]


def tool_turns(request: dict) -> list[str]:
    """The tool results a request to the agent's model carried, in order."""
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def assert_the_gate_saw_the_whole_conversation(seen: list[tuple]) -> None:
    """The second call was scored with the system message, the question, the first call and its result."""
    (first, tools, (call1,)), (history, _, (call2,)) = seen
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"] == QUESTION
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool"]
    assert history[0]["content"] == SYSTEM and history[2]["tool_calls"][0]["id"] == call1["id"]
    assert history[3]["tool_call_id"] == call1["id"]
    assert [t["function"]["name"] for t in tools] == ["get_date", "add_days"]
    assert tools[1]["function"]["parameters"]["required"] == ["date", "days"]
    assert (call2["function"]["name"], json.loads(call2["function"]["arguments"])) == TASK[1][1:]


# ---------------------------------------------------------------------- OpenAI Agents SDK
def run_agents_sdk(gate: Scorer | str, hook: str, approve: bool = False, task: list = TASK, **guarding):
    """The task through ``Runner.run_sync``, guarded by ``gate`` (``guarding``: GateGuard's timeout, fail_open);
    ``hook`` is how held calls are stopped: ``tool_input_guardrails`` (blocked) or ``needs_approval`` (a person
    is asked; ``approve`` says yes to each)."""
    ran, asked = [], []
    guard = GateGuard(gate, **guarding)
    hooked = {"tool_input_guardrails": [guard.guardrail]} if hook == "tool_input_guardrails" else {
        "needs_approval": guard.needs_approval}
    with ScriptedModel(task) as model:
        agent = Agent(name="assistant", instructions=SYSTEM,
                      tools=[function_tool(f, **hooked) for f in task_tools(ran)],
                      model=OpenAIChatCompletionsModel("scripted", AsyncOpenAI(base_url=model.url, api_key="-")))
        result = Runner.run_sync(agent, QUESTION, hooks=guard.hooks)
        while approve and result.interruptions:
            state = result.to_state()
            for item in result.interruptions:
                asked.append(guard.verdict(item.call_id))
                state.approve(item)
            result = Runner.run_sync(agent, state, hooks=guard.hooks)
    return result, guard, ran, asked, model.requests


@pytest.mark.parametrize("hook", ["tool_input_guardrails", "needs_approval"])
def test_agents_sdk_runs_the_calls_the_gate_trusts_and_it_sees_the_whole_conversation(gate, hook):
    seen = Recording(gate, 0.0)
    result, _, ran, _, requests = run_agents_sdk(seen, hook)
    assert ran == ["get_date", "add_days"] and result.final_output == TASK[2][1] and not result.interruptions
    assert tool_turns(requests[-1]) == ["2022-09-30", "2022-10-30"]  # each result fed back to the model
    assert_the_gate_saw_the_whole_conversation(seen.seen)


def test_agents_sdk_guardrail_blocks_a_held_call_and_tells_the_model_why(gate):
    result, _, ran, _, requests = run_agents_sdk(Recording(gate, 1.0), "tool_input_guardrails")
    assert ran == [] and result.final_output == TASK[2][1]
    refusals = tool_turns(requests[-1])
    assert len(refusals) == 2 and all("The tool was not run" in r and "(threshold 100%)" in r for r in refusals)
    verdicts = [r.output.output_info for r in result.tool_input_guardrail_results]
    assert [v.name for v in verdicts] == ["get_date", "add_days"] and not any(v.execute for v in verdicts)
    assert all(0.0 <= v.probability <= 1.0 and v.tau == 1.0 for v in verdicts)


def test_agents_sdk_asks_about_a_held_call_and_runs_it_once_approved(gate):
    result, _, ran, _, _ = run_agents_sdk(Recording(gate, 1.0), "needs_approval")
    (item,) = result.interruptions
    assert ran == [] and result.final_output is None and item.tool_name == "get_date"
    result, _, ran, asked, requests = run_agents_sdk(Recording(gate, 1.0), "needs_approval", approve=True)
    assert [v.name for v in asked] == ["get_date", "add_days"] and not any(v.execute for v in asked)
    assert ran == ["get_date", "add_days"] and result.final_output == TASK[2][1]
    assert tool_turns(requests[-1]) == ["2022-09-30", "2022-10-30"]


def test_agents_sdk_refuses_a_run_without_the_guards_hooks(gate):
    guard, ran = GateGuard(gate, tau=0.0), []
    with ScriptedModel(TASK) as model:
        agent = Agent(name="assistant", tools=[function_tool(f, needs_approval=guard.needs_approval)
                                               for f in task_tools(ran)],
                      model=OpenAIChatCompletionsModel("scripted", AsyncOpenAI(base_url=model.url, api_key="-")))
        with pytest.raises(AgentsException, match="pass hooks=guard.hooks to Runner.run"):  # the SDK wraps ours
            Runner.run_sync(agent, QUESTION)
    assert ran == []


# ---------------------------------------------------------------------- LangChain
def run_langchain(gate: Scorer | str, review: bool = False, approve: bool = False, use_async: bool = False,
                  task: list = TASK, **guarding):
    """The task through ``create_agent``, guarded by ``gate`` (``guarding``: GateMiddleware's timeout,
    fail_open): held calls blocked, or (``review``) asked about, each approved if ``approve``; ``use_async`` runs
    it with ``ainvoke`` (the middleware's async hooks)."""
    ran, asked = [], []
    guard = GateMiddleware(gate, **guarding)
    tools = [tool(f) for f in task_tools(ran)]
    middleware = [guard, guard.review(tools)] if review else [guard]
    config = {"configurable": {"thread_id": "task"}}
    with ScriptedModel(task) as model:
        chat = ChatOpenAI(model="scripted", base_url=model.url, api_key="-", max_retries=0)
        agent = create_agent(chat, tools, system_prompt=SYSTEM, middleware=middleware, checkpointer=InMemorySaver())
        question = {"messages": [{"role": "user", "content": QUESTION}]}
        result = asyncio.run(agent.ainvoke(question, config)) if use_async else agent.invoke(question, config)
        while approve and "__interrupt__" in result:
            asked.extend(result["__interrupt__"][0].value["action_requests"])
            result = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    return result, ran, asked, model.requests


@pytest.mark.parametrize("use_async", [False, True], ids=["invoke", "ainvoke"])
def test_langchain_runs_the_calls_the_gate_trusts_and_it_sees_the_whole_conversation(gate, use_async):
    seen = Recording(gate, 0.0)
    result, ran, _, requests = run_langchain(seen, use_async=use_async)
    assert ran == ["get_date", "add_days"] and result["messages"][-1].content == TASK[2][1]
    assert tool_turns(requests[-1]) == ["2022-09-30", "2022-10-30"]
    assert_the_gate_saw_the_whole_conversation(seen.seen)
    verdicts = [m.response_metadata["mice_exp"] for m in result["messages"] if m.type == "ai" and m.tool_calls]
    assert [next(iter(v.values()))["execute"] for v in verdicts] == [True, True]  # kept in the agent's state


def test_langchain_blocks_a_held_call_and_tells_the_model_why(gate):
    result, ran, _, requests = run_langchain(Recording(gate, 1.0))
    assert ran == [] and result["messages"][-1].content == TASK[2][1]
    blocked = [m for m in result["messages"] if m.type == "tool"]
    assert [m.status for m in blocked] == ["error", "error"]
    assert all("The tool was not run" in m.content for m in blocked) and tool_turns(requests[-1]) == [
        m.content for m in blocked]


def test_langchain_asks_about_a_held_call_and_runs_it_once_approved(gate):
    result, ran, _, _ = run_langchain(Recording(gate, 1.0), review=True)
    (interrupt,) = result["__interrupt__"]
    (request,) = interrupt.value["action_requests"]
    assert ran == [] and request["name"] == "get_date" and request["args"] == {"city": "Paris"}
    assert re.search(r"a \d+% chance of being right \(threshold 100%\)", request["description"])
    result, ran, asked, requests = run_langchain(Recording(gate, 1.0), review=True, approve=True)
    assert [a["name"] for a in asked] == ["get_date", "add_days"]
    assert ran == ["get_date", "add_days"] and result["messages"][-1].content == TASK[2][1]
    assert tool_turns(requests[-1]) == ["2022-09-30", "2022-10-30"]


# ---------------------------------------------------------------------- what both share
MISFIT = [("call", "get_date", {"town": "Paris"}), ("answer", "I could not get the date.")]


def test_a_call_that_does_not_fit_its_tools_schema_is_blocked_at_any_threshold(gate):
    result, _, ran, _, requests = run_agents_sdk(GateScorer(gate, 0.0), "tool_input_guardrails", task=MISFIT)
    assert ran == [] and result.final_output == MISFIT[1][1]
    (why,) = tool_turns(requests[-1])
    assert why.startswith("The confidence gate refused the call to get_date: ") and "'city'" in why
    result, ran, _, requests = run_langchain(GateScorer(gate, 0.0), task=MISFIT)
    assert ran == [] and tool_turns(requests[-1]) == [why]


@pytest.fixture(scope="module")
def served(gate):
    """``mice-exp serve`` on the same gate, in a thread on 127.0.0.1."""
    server = open_server(gate, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("tau", [0.0, 1.0])
def test_over_http_a_guard_gets_the_verdicts_it_gets_in_process(gate, served, tau):
    _, remote, ran, _, _ = run_agents_sdk(HttpScorer(served.url, tau), "tool_input_guardrails")
    _, local, ran_locally, _, _ = run_agents_sdk(GateScorer(gate, tau), "tool_input_guardrails")
    assert ran == ran_locally == (["get_date", "add_days"] if tau == 0.0 else [])
    assert remote.verdicts.keys() == local.verdicts.keys() == {"call_1", "call_2"}
    for call_id, verdict in remote.verdicts.items():
        assert verdict.probability == pytest.approx(local.verdicts[call_id].probability, abs=1e-6)
        assert (verdict.execute, verdict.tau) == (local.verdicts[call_id].execute, tau)


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail-closed", "fail-open"])
def test_both_hosts_deny_every_call_when_the_gate_gives_no_verdict_unless_told_to_fail_open(unavailable, fail_open):
    """Down, slower than the timeout, or not the gate: each call is denied (the model reads why), or with
    ``fail_open=True`` runs unscored; either way within the guard's timeout (the slow stand-in waits 30 s)."""
    start = time.perf_counter()
    _, guard, ran, _, requests = run_agents_sdk(unavailable, "tool_input_guardrails", timeout=TIMEOUT,
                                                fail_open=fail_open)
    result, ran_in_langchain, _, _ = run_langchain(unavailable, timeout=TIMEOUT, fail_open=fail_open)
    seconds = time.perf_counter() - start
    assert ran == ran_in_langchain == (["get_date", "add_days"] if fail_open else [])
    verdicts = [*guard.verdicts.values(), *(Verdict(**v) for m in result["messages"] if m.type == "ai" and m.tool_calls
                                            for v in m.response_metadata["mice_exp"].values())]
    assert len(verdicts) == 4 and {(v.decision, v.probability, v.tau) for v in verdicts} == {
        ("allow" if fail_open else "deny", None, None)}
    if not fail_open:
        assert all("fail-closed" in why for why in tool_turns(requests[-1]))
    assert seconds < 4 * TIMEOUT + 20  # four calls, each at most its timeout; the slow gate alone would take 120 s


def test_a_call_is_decided_once_so_a_replay_gets_the_same_verdict(gate):
    seen = Recording(gate, 0.5)
    guarded = scorer(seen)
    messages, tools = [{"role": "user", "content": QUESTION}], [convert_to_openai_tool(tool(f)) for f in task_tools([])]
    call = tool_call("call_7", "get_date", {"city": "Paris"})
    first = guarded.score_calls(messages, tools, [call])
    assert guarded.score_calls(messages, tools, [call]) == first and len(seen.seen) == 1
    (other,) = guarded.score_calls(messages, tools, [tool_call("call_7", "get_date", {"city": "Lyon"})])
    assert len(seen.seen) == 2 and other.probability is not None  # the same id with other arguments: scored anew


#: One right call in five layouts: json.dumps' (what LangChain re-serialises any call to), indented, keys in another
#: order, no spaces, and escapes with odd whitespace. The gate renders every call canonically before scoring it.
LAYOUTS = ['{"date": "2022-09-30", "days": 30}', '{\n    "date": "2022-09-30",\n    "days": 30\n}',
           '{"days": 30, "date": "2022-09-30"}', '{"date":"2022-09-30","days":30}',
           '{ "date" :\t"2022\\u002d09\\u002d30" ,\n"days": 3\\u0030 }'.replace("3\\u0030", "30")]


@pytest.fixture(scope="module")
def soft_gate(fitted, tiny_llm):  # noqa: F811 - the fixture imported above
    """The module's gate with a softer estimator (the fixture's says 0 or 1): a probability the call's tokens move."""
    from mice_exp.estimators import MiceLogisticRegression

    gate = Gate.load(fitted[0], llm=tiny_llm)
    gate.estimator = MiceLogisticRegression(C=20.0).fit(fitted[2].X, [1, 1, 0, 0, 1, 1])
    return gate


def test_one_call_in_any_layout_gets_one_probability_from_gate_http_and_both_hosts(soft_gate):
    """Each surface hands the gate the call's text as it came (the Agents SDK the model's, LangChain its own
    re-serialisation, HTTP and Gate.score the caller's); every one of them gives every layout one probability,
    the one Gate.score gives the same messages and tools (the Agents SDK's tools carry titles and ``strict``,
    which the gate's prompt shows, so it is compared with Gate.score on its own tools)."""
    gate = soft_gate
    served = open_server(gate, quiet=True)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    assert len({json.dumps(json.loads(text), sort_keys=True) for text in LAYOUTS}) == 1 < len(set(LAYOUTS))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    tools = [convert_to_openai_tool(tool(f)) for f in task_tools([])]
    found = []
    for text in LAYOUTS:
        call = {"id": "call_0", "type": "function", "function": {"name": "add_days", "arguments": text}}
        body = json.dumps({"messages": messages, "tools": tools, "tool_calls": [call]}).encode()
        request = urllib.request.Request(served.url + "/tool_calls/check", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            (over_http,) = json.loads(answer.read())["results"]
        task = [("call", "add_days", text), ("answer", "Done.")]
        sdk = Recording(gate, 0.0)
        _, guard, _, _, _ = run_agents_sdk(sdk, "tool_input_guardrails", task=task)
        lc = Recording(gate, 0.0)
        result, _, _, _ = run_langchain(lc, task=task)
        (in_langchain,) = [next(iter(m.response_metadata["mice_exp"].values())) for m in result["messages"]
                           if m.type == "ai" and m.tool_calls]
        (sdk_messages, sdk_tools, _), (lc_messages, lc_tools, _) = sdk.seen[0], lc.seen[0]
        assert (sdk_messages, lc_messages, lc_tools) == (messages, messages, tools)
        found.append({"Gate.score": gate.score(messages, tools, call).probability, "http": over_http["probability"],
                      "LangChain": in_langchain["probability"],
                      "Agents SDK": next(iter(guard.verdicts.values())).probability,
                      "Gate.score, SDK tools": gate.score(messages, sdk_tools, call).probability})
    served.shutdown()
    served.server_close()
    first = found[0]
    for surface in ("http", "LangChain"):
        assert first[surface] == pytest.approx(first["Gate.score"], abs=1e-6), surface
    assert first["Agents SDK"] == pytest.approx(first["Gate.score, SDK tools"], abs=1e-6)
    for text, probabilities in zip(LAYOUTS, found):
        assert probabilities == pytest.approx(first, abs=1e-6), text
    other = {"type": "function", "function": {"name": "add_days", "arguments": '{"date": "2022-09-30", "days": 31}'}}
    assert abs(gate.score(messages, tools, other).probability - first["Gate.score"]) > 1e-3  # its tokens move it


def test_the_hosts_package_imports_without_torch():
    hosts = ["openai_agents", "langchain_middleware", "claude_hooks", "google_adk", "inspect_approver", "mcp_proxy"]
    code = f"import sys; import {', '.join('mice_exp.hosts.' + h for h in hosts)}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE_ROOT)
    assert out.stdout.strip() == "False"


def test_a_gate_is_a_loaded_gate_or_the_url_of_mice_exp_serve():
    assert scorer("http://127.0.0.1:8000/v1").scorer.url == "http://127.0.0.1:8000/v1/tool_calls/check"
    with pytest.raises(UserError, match="expected a loaded Gate"):
        scorer("gate/")
    unreachable = HttpScorer("http://127.0.0.1:9", timeout=5)  # the discard port: nothing listens
    with pytest.raises(UserError, match="cannot be reached"):
        unreachable.score_calls([{"role": "user", "content": "q"}], [], [{"id": "c", "function": {"name": "f"}}])


# ---------------------------------------------------------------------- docs/hosts.md
EXAMPLES = {"get_weather": [("call", "get_weather", {"city": "Paris"}), ("answer", "Sunny in Paris.")],
            "book_table": [("call", "book_table", {"city": "Paris", "people": 2}), ("answer", "Booked.")]}


@pytest.mark.parametrize("section, answers", [("OpenAI Agents SDK", ["Sunny in Paris.", "Booked."]),
                                              ("LangChain 1.x (`create_agent`)", ["Sunny in Paris."] * 2)])
def test_the_docs_examples_run_as_written(gate, fitted, section, answers, capsys):  # noqa: F811
    blocks = code_blocks(section)
    assert len(blocks) == 2
    with ScriptedModel(EXAMPLES) as model:
        namespace = {"GATE": str(fitted[0]), "AGENT_URL": model.url}
        for block, answer in zip(blocks, answers):
            run_block(block, namespace, f"docs/hosts.md: {section}")
            assert capsys.readouterr().out.splitlines()[-1] == answer
            assert len(tool_turns(model.requests[-1])) == 1  # the tool's result, or why the gate held the call


# ---------------------------------------------------------------------- SmolLM2 through mice-exp serve
DATE_QUESTION = "What is the date 90 days from 2022-10-14?"


def add_date(date: str, days: int) -> str:
    """Add days to a date."""
    return "2023-01-12"


@pytest.fixture(scope="module")
def smollm2_served():
    """The published SmolLM2 gate behind ``mice-exp serve`` (``on_abstain=pass``: a held call comes back as a
    tool call whose id says so), loaded before the first request's timeout starts."""
    gate = Gate.load(PACKAGE_ROOT / "experiments" / "abstention" / "gate-smollm2_135m")
    gate.warm()
    server = open_server(gate, quiet=True, on_abstain="pass")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_smollm2_through_mice_exp_serve_guards_both_hosts_end_to_end(smollm2_served):
    """Each host guards over HTTP a run whose model proposes the right call (``days`` 90) or a wrong one (``days``
    9): the gate ranks the right call above the wrong one, a held call waits for a person (Agents SDK) and runs
    once approved, a held one is blocked (LangChain)."""
    server, gate = smollm2_served, smollm2_served.service.gate
    right = [("call", "add_date", {"date": "2022-10-14", "days": 90}), ("answer", "2023-01-12")]
    wrong = [("call", "add_date", {"date": "2022-10-14", "days": 9}), ("answer", "I did not add the days.")]
    guard, ran = GateGuard(server.url), []

    def dated(date: str, days: int) -> str:
        """Add days to a date."""
        ran.append((date, days))
        return add_date(date, days)

    with ScriptedModel(right) as model:
        agent = Agent(name="assistant", tools=[function_tool(dated, name_override="add_date",
                                                             needs_approval=guard.needs_approval)],
                      model=OpenAIChatCompletionsModel("scripted", AsyncOpenAI(base_url=model.url, api_key="-")))
        result = Runner.run_sync(agent, DATE_QUESTION, hooks=guard.hooks)
        (verdict,) = guard.verdicts.values()
        if not verdict.execute:  # held: a person approves it
            (item,) = result.interruptions
            state = result.to_state()
            state.approve(item)
            result = Runner.run_sync(agent, state, hooks=guard.hooks)
    assert ran == [("2022-10-14", 90)] and result.final_output == "2023-01-12"
    with ScriptedModel(wrong) as model:
        agent = create_agent(ChatOpenAI(model="scripted", base_url=model.url, api_key="-"), [tool(add_date)],
                             middleware=[GateMiddleware(server.url)])
        messages = agent.invoke({"messages": [{"role": "user", "content": DATE_QUESTION}]})["messages"]
    (held,) = [m.response_metadata["mice_exp"] for m in messages if m.type == "ai" and m.tool_calls]
    (doubt,) = held.values()
    assert doubt["tau"] == gate.tau and (messages[2].status == "error") == (not doubt["execute"])
    # the right call, scored with what the middleware sent (LangChain's schema of the tool, not the SDK's)
    (sure,) = HttpScorer(server.url).score_calls([{"role": "user", "content": DATE_QUESTION}],
                                                 [convert_to_openai_tool(tool(add_date))],
                                                 [tool_call("right", "add_date", right[0][2])])
    print(f"SmolLM2 gate: p(days 90) = {sure.probability:.3f} (Agents SDK's schema: {verdict.probability:.3f}), "
          f"p(days 9) = {doubt['probability']:.3f}")
    assert doubt["probability"] < sure.probability


POOLED = PACKAGE_ROOT / "experiments" / "actors" / "gate-smollm2_135m"


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.skipif(not POOLED.is_dir(), reason="the pooled gate is made by experiments/actors/tables.py")
def test_the_pooled_gate_gives_a_right_call_one_probability_in_both_layouts_under_both_hosts(capsys):
    """Issue 57's host trial: the SmolLM2 gate fitted on 19 agents' calls (experiments/actors), in-process, under
    the Agents SDK (``Runner.run``, the model's own argument text) and LangChain (``create_agent``, which
    re-serialises it); the model proposes the right ``add_date`` call indented and compact, and a wrong one
    (``days`` 9). Prints the figures docs/hosts.md quotes."""
    gate = Gate.load(POOLED)
    gate.warm()
    right = {"date": "2022-10-14", "days": 90}
    calls = {"right, indented": json.dumps(right, indent=4), "right, compact": json.dumps(right),
             "wrong (days 9)": json.dumps({"date": "2022-10-14", "days": 9})}
    found = {}
    for name, text in calls.items():
        task = [("call", "add_date", text), ("answer", "Done.")]
        ran: list = []
        guard = GateGuard(GateScorer(gate, 0.0))
        with ScriptedModel(task) as model:
            agent = Agent(name="assistant", tools=[function_tool(add_date, tool_input_guardrails=[guard.guardrail])],
                          model=OpenAIChatCompletionsModel("scripted", AsyncOpenAI(base_url=model.url, api_key="-")))
            Runner.run_sync(agent, DATE_QUESTION, hooks=guard.hooks)
        with ScriptedModel(task) as model:
            lc = create_agent(ChatOpenAI(model="scripted", base_url=model.url, api_key="-"), [tool(add_date)],
                              middleware=[GateMiddleware(GateScorer(gate, 0.0))])
            messages = lc.invoke({"messages": [{"role": "user", "content": DATE_QUESTION}]})["messages"]
        (verdict,) = [next(iter(m.response_metadata["mice_exp"].values())) for m in messages
                      if m.type == "ai" and m.tool_calls]
        found[name] = (next(iter(guard.verdicts.values())).probability, verdict["probability"])
    with capsys.disabled():
        for name, (sdk, langchain) in found.items():
            print(f"pooled SmolLM2 gate, {name}: Agents SDK p = {sdk:.4f}, LangChain p = {langchain:.4f}")
    for host in (0, 1):
        assert found["right, indented"][host] == pytest.approx(found["right, compact"][host], abs=1e-6)
        assert found["wrong (days 9)"][host] < found["right, compact"][host]


def held_by_serve(call_id: str) -> bool:
    """``mice-exp serve`` (``on_abstain=pass``) returns a held call with an id ``call_pass_p<p x 10^4>_<hex>``."""
    return call_id.startswith("call_pass_")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_smollm2_through_mice_exp_serve_as_the_agents_model_a_held_call_waits_for_a_person(smollm2_served):
    """``mice-exp serve`` as the agent's model (issue 39): its call at tau 1 is held, a person approves it in
    each framework, the tool runs and its result goes back to the gate's LLM, whose next reply is a text answer
    or another call that waits for the person in turn (at most three are approved)."""
    server, ran = smollm2_served, []
    at_one = {"mice_exp": {"tau": 1.0}}  # every call held, so each one reaches the person

    def dated(date: str, days: int) -> str:
        """Add days to a date."""
        ran.append("agents_sdk")
        return add_date(date, days)

    client = AsyncOpenAI(base_url=server.url, api_key="-", timeout=900)
    agent = Agent(name="assistant", model=OpenAIChatCompletionsModel(server.service.model, client),
                  model_settings=ModelSettings(extra_body=at_one),
                  tools=[function_tool(dated, name_override="add_date",
                                       needs_approval=lambda context, arguments, call_id: held_by_serve(call_id))])
    result, asked = Runner.run_sync(agent, DATE_QUESTION, max_turns=4), []
    while result.interruptions and len(asked) < 3:
        state = result.to_state()
        for item in result.interruptions:
            asked.append(item.call_id)
            state.approve(item)
        result = Runner.run_sync(agent, state, max_turns=4)
    print("Agents SDK through serve:", asked, repr(result.final_output))
    assert asked and all(held_by_serve(a) for a in asked) and len(ran) == len(asked)
    assert isinstance(result.final_output, str) and not result.interruptions

    review = HumanInTheLoopMiddleware(interrupt_on={"add_date": {
        "allowed_decisions": ["approve", "reject"], "when": lambda request: held_by_serve(request.tool_call["id"])}})
    model = ChatOpenAI(model=server.service.model, base_url=server.url, api_key="-", timeout=900, extra_body=at_one)
    agent = create_agent(model, [tool(add_date)], middleware=[review], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "serve"}}
    result = agent.invoke({"messages": [{"role": "user", "content": DATE_QUESTION}]}, config)
    reviewed = []
    while "__interrupt__" in result and len(reviewed) < 3:
        reviewed.extend(result["__interrupt__"][0].value["action_requests"])
        result = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    results = [m for m in result["messages"] if m.type == "tool"]
    print("LangChain through serve:", [r["args"] for r in reviewed], repr(result["messages"][-1].content))
    assert reviewed and len(results) == len(reviewed) and all(r.content == "2023-01-12" for r in results)
    # SmolLM2 may call again after a result (measured: add_date on the result's date); that call waits too
    assert "__interrupt__" in result or not result["messages"][-1].tool_calls
