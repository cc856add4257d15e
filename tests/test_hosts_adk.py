"""The gate inside a Google ADK agent, in a real ADK ``Runner`` loop whose model is a ``BaseLlm`` answering from a
script: it proposes a right call and a wrong one; ``GateCallback.before_tool`` lets the first run and refuses
the second (the model reads why), or asks the user through Tool Confirmation and runs the call once confirmed.

The decisions are shown with a stand-in gate that decides per tool (tests/stand_in_gate.py: the tiny test
gate's probabilities are 0 or 1); the probability the real gate gives runs against test_hosts' served gate.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the ADK host needs google-adk (the adk extra)")

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.models.llm_request import LlmRequest  # noqa: E402
from google.adk.runners import InMemoryRunner  # noqa: E402
from google.adk.tools.tool_confirmation import ToolConfirmation  # noqa: E402
from google.genai import types  # noqa: E402

from mice_exp.hosts.google_adk import GateCallback  # noqa: E402
from tests.doc_blocks import code_blocks, run_block  # noqa: E402
from tests.scripted_adk import ScriptedLlm  # noqa: E402
from tests.stand_in_gate import TIMEOUT, StandInGate, unavailable  # noqa: E402, F401 - unavailable: a fixture
from tests.test_gate import fitted  # noqa: E402, F401 - test_gate's saved tiny_random gate
from tests.test_hosts import gate, served  # noqa: E402, F401 - the gate loaded from it, and mice-exp serve on it

pytestmark = pytest.mark.timeout(300)
QUESTION, SYSTEM = "Book a table for two in Paris.", "Answer with the tools."
SCRIPT = [("call", "book_table", {"city": "Paris", "people": 2}), ("call", "cancel_booking", {"booking": "b-7"}),
          ("answer", "Done.")]


def results(requests: list[LlmRequest]) -> list[Any]:
    """The tool results the model was sent last, in order."""
    return [p.function_response.response for c in requests[-1].contents for p in c.parts or []
            if p.function_response is not None]


def run_adk(gate_url: str, confirm: bool = False, confirmed: bool | None = None, **guarding):
    """The script through an ADK Runner with the gate's before_tool_callback; ``confirmed`` answers a Tool
    Confirmation the run asks for. What ran, the model's requests, the confirmation asked for (or None)."""
    ran: list[str] = []

    def book_table(city: str, people: int) -> str:
        """Book a restaurant table."""
        ran.append("book_table")
        return f"Booked for {people} in {city}"

    def cancel_booking(booking: str) -> str:
        """Cancel a restaurant booking."""
        ran.append("cancel_booking")
        return f"Cancelled {booking}"

    model = ScriptedLlm(model="scripted", script=SCRIPT)
    guard = GateCallback(gate_url, confirm=confirm, **guarding)
    agent = LlmAgent(name="assistant", model=model, instruction=SYSTEM, tools=[book_table, cancel_booking],
                     before_tool_callback=guard.before_tool)
    return ran, model.requests, run_agent(agent, confirmed), guard


def run_agent(agent: LlmAgent, confirmed: bool | None = None) -> types.FunctionCall | None:
    """The agent asked QUESTION in an ADK InMemoryRunner, to the end; ``confirmed`` answers the first Tool
    Confirmation the run asks for (None: the run stops there). The confirmation asked for, or None."""
    runner = InMemoryRunner(agent=agent, app_name="gated")

    async def run() -> Any:
        session = await runner.session_service.create_session(app_name="gated", user_id="u")
        asked = None
        message = types.Content(role="user", parts=[types.Part(text=QUESTION)])
        while message is not None:
            asking = [p.function_call async for event in runner.run_async(user_id="u", session_id=session.id,
                                                                           new_message=message)
                      for p in (event.content.parts if event.content else None) or []
                      if p.function_call is not None and p.function_call.name == "adk_request_confirmation"]
            message = None
            if asking and confirmed is not None and asked is None:
                asked = asking[0]
                answer = types.FunctionResponse(id=asked.id, name="adk_request_confirmation",
                                                response=ToolConfirmation(confirmed=confirmed).model_dump())
                message = types.Content(role="user", parts=[types.Part(function_response=answer)])
            elif asking:
                asked = asking[0]
        return asked

    return asyncio.run(run())


def test_a_trusted_call_runs_and_a_denied_one_is_refused_with_the_gates_reason():
    with StandInGate(decision={"book_table": "allow", "cancel_booking": "deny"}, probability=0.42) as stand_in:
        ran, requests, asked, _ = run_adk(stand_in.url)
    assert ran == ["book_table"] and asked is None
    booked, refused = results(requests)
    assert booked == {"result": "Booked for 2 in Paris"}
    assert refused["error"].startswith("The confidence gate refused the call to cancel_booking (42%)")
    first, second = stand_in.requests
    assert [m["role"] for m in first["messages"]] == ["system", "user"] and first["messages"][1]["content"] == QUESTION
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert [t["function"]["name"] for t in first["tools"]] == ["book_table"]  # the called tool's declaration
    assert first["tools"][0]["function"]["parameters"]["properties"]["people"]["type"] == "integer"


@pytest.mark.parametrize("confirmed", [True, False], ids=["confirmed", "refused"])
def test_a_doubted_call_waits_for_the_users_tool_confirmation(confirmed):
    with StandInGate(decision={"book_table": "ask", "cancel_booking": "deny"}, probability=0.42) as stand_in:
        ran, requests, asked, guard = run_adk(stand_in.url, confirm=True, confirmed=confirmed)
        assert asked.args["toolConfirmation"]["hint"].startswith("The confidence gate gives this call to book_table")
        assert ran == (["book_table"] if confirmed else [])
        assert len([r for r in stand_in.requests if r["tool_calls"][0]["function"]["name"] == "book_table"]) == 1


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail-closed", "fail-open"])
def test_no_call_runs_when_the_gate_gives_no_verdict_unless_told_to_fail_open(unavailable, fail_open):
    ran, requests, _, _ = run_adk(unavailable, timeout=TIMEOUT, fail_open=fail_open)
    assert ran == (["book_table", "cancel_booking"] if fail_open else [])
    assert fail_open or all("fail-closed" in r["error"] for r in results(requests))


def test_the_callback_gives_the_probability_the_gate_gives(gate, served):  # noqa: F811
    _, _, _, guard = run_adk(served.url, tau=1.0)  # every call held: refused with the gate's reason
    verdicts = list(guard.scorer.verdicts.values())
    assert [v.name for v in verdicts] == ["book_table", "cancel_booking"]
    assert all(v.probability is not None and v.tau == 1.0 and not v.execute for v in verdicts)


# ---------------------------------------------------------------------- docs/hosts.md
SECTION = "Google ADK (`before_tool_callback`, Tool Confirmation)"
#: The doc's agent is asked for a table for two: the gate trusts that call, denies a table for none, doubts one
#: for twenty (``confirm=True``: the user is asked, and confirms it).
BOOKINGS = {2: "allow", 0: "deny", 20: "ask"}


def test_the_docs_example_runs_as_written_in_a_runner_loop():
    (block,) = code_blocks(SECTION)
    script = [("call", "book_table", {"city": "Paris", "people": n}) for n in BOOKINGS] + [("answer", "Done.")]
    model = ScriptedLlm(model="scripted", script=script)
    decide = lambda call: BOOKINGS[json.loads(call["function"]["arguments"])["people"]]  # noqa: E731
    with StandInGate(decision=decide, probability=0.42) as stand_in:
        namespace = {"GATE_URL": stand_in.url, "MODEL": model}
        run_block(block, namespace, f"docs/hosts.md: {SECTION}")
        asked = run_agent(namespace["agent"], confirmed=True)
    assert asked.args["toolConfirmation"]["hint"].startswith("The confidence gate gives this call to book_table")
    booked, refused, confirmed = results(model.requests)
    assert (booked, confirmed) == ({"result": "Booked for 2 in Paris"}, {"result": "Booked for 20 in Paris"})
    assert refused["error"].startswith("The confidence gate refused the call to book_table (42%)")
    assert len(stand_in.requests) == 3  # the confirmed call was decided once
