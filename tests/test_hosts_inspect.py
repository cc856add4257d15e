"""The gate as an Inspect approver, in a real Inspect eval whose model is Inspect's ``mockllm`` answering from a
script: it proposes a right call and a wrong one, the approver decides each, and the eval log keeps every
approval with the gate's probability in its explanation.

The three decisions (approve, escalate, reject) are shown with a stand-in gate that decides per tool
(tests/stand_in_gate.py: the tiny test gate's probabilities are 0 or 1); the probability the real gate gives
runs against test_hosts' served gate.
"""

from __future__ import annotations

import pytest

pytest.importorskip("inspect_ai", reason="the Inspect host needs inspect-ai (the inspect extra)")

from inspect_ai import Task, eval  # noqa: E402
from inspect_ai.approval import ApprovalPolicy  # noqa: E402
from inspect_ai.dataset import Sample  # noqa: E402
from inspect_ai.log import EvalLog, list_eval_logs, read_eval_log  # noqa: E402
from inspect_ai.model import Model, ModelOutput, ModelUsage, get_model  # noqa: E402
from inspect_ai.solver import generate, use_tools  # noqa: E402
from inspect_ai.tool import tool  # noqa: E402

from mice_exp.hosts.inspect_approver import gate_approver  # noqa: E402
from tests.doc_blocks import code_blocks, run_block  # noqa: E402
from tests.stand_in_gate import TIMEOUT, StandInGate, unavailable  # noqa: E402, F401 - unavailable: a fixture
from tests.test_gate import fitted  # noqa: E402, F401 - test_gate's saved tiny_random gate
from tests.test_hosts import gate, served  # noqa: E402, F401 - the gate loaded from it, and mice-exp serve on it

pytestmark = pytest.mark.timeout(300)
QUESTION = "Book a table for two in Paris."
RAN: list[str] = []


@tool
def book_table():
    async def execute(city: str, people: int) -> str:
        """Book a restaurant table.

        Args:
            city: Where.
            people: How many people.
        """
        RAN.append(f"book_table {city} {people}")
        return f"Booked for {people} in {city}"

    return execute


@tool
def cancel_booking():
    async def execute(booking: str) -> str:
        """Cancel a restaurant booking.

        Args:
            booking: The booking's id.
        """
        RAN.append(f"cancel_booking {booking}")
        return f"Cancelled {booking}"

    return execute


def scripted() -> tuple[Task, Model]:
    """One sample and its model: the model calls book_table (right), then cancel_booking (wrong), then answers."""
    script = [ModelOutput.for_tool_call("mockllm/model", "book_table", {"city": "Paris", "people": 2},
                                        tool_call_id="call_1"),
              ModelOutput.for_tool_call("mockllm/model", "cancel_booking", {"booking": "b-7"}, tool_call_id="call_2"),
              ModelOutput.from_content("mockllm/model", "Done.")]
    for output in script:  # else mockllm counts tokens with tiktoken, whose encoding is fetched from the network
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    task = Task(dataset=[Sample(input=QUESTION)], solver=[use_tools([book_table(), cancel_booking()]), generate()])
    RAN.clear()
    return task, get_model("mockllm/model", custom_outputs=script)


def gate_approvals(log: EvalLog) -> list:
    """The eval log's approval events of the gate (a call it escalates past the last approver is then rejected
    by Inspect's policy, an event of its own)."""
    assert log.status == "success", log.error
    return [e for e in log.samples[0].events if e.event == "approval"
            and e.approver.split("/")[-1] == "mice_exp_gate"]


def evaluated(gate_url: str, log_dir, **guarding):
    """The scripted sample with every call going to the gate's approver: its approvals, and the tools that ran."""
    task, model = scripted()
    (log,) = eval(task, model=model, log_dir=str(log_dir),
                  approval=[ApprovalPolicy(gate_approver(gate_url, **guarding), "*")], display="none")
    return gate_approvals(log), list(RAN)


def test_the_approver_approves_the_right_call_and_rejects_the_wrong_one_and_the_log_keeps_why(tmp_path):
    with StandInGate(decision={"book_table": "allow", "cancel_booking": "deny"}, probability=0.42) as stand_in:
        approvals, ran = evaluated(stand_in.url, tmp_path)
    assert ran == ["book_table Paris 2"]
    assert [(a.call.function, a.decision) for a in approvals] == [("book_table", "approve"),
                                                                    ("cancel_booking", "reject")]
    assert "a 42% chance of being right" in approvals[0].explanation and "(42%)" in approvals[1].explanation
    first, second = stand_in.requests  # the gate saw the question, the tools, and for the second the first call
    assert [t["function"]["name"] for t in first["tools"]] == ["book_table", "cancel_booking"]
    assert first["tools"][0]["function"]["parameters"]["properties"]["people"]["type"] == "integer"
    assert [m["role"] for m in first["messages"]] == ["user"] and first["messages"][0]["content"] == QUESTION
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"]


def test_a_doubted_call_is_escalated(tmp_path):
    with StandInGate(decision="ask") as stand_in:
        approvals, ran = evaluated(stand_in.url, tmp_path)
    assert {a.decision for a in approvals} == {"escalate"} and ran == []  # no approver after it: Inspect rejects


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail-closed", "fail-open"])
def test_the_approver_rejects_when_the_gate_gives_no_verdict_unless_told_to_fail_open(tmp_path, unavailable,
                                                                                       fail_open):
    approvals, ran = evaluated(unavailable, tmp_path, timeout=TIMEOUT, fail_open=fail_open)
    assert {a.decision for a in approvals} == {"approve" if fail_open else "reject"}
    assert len(ran) == (2 if fail_open else 0)


def test_the_log_holds_the_probability_the_gate_gives(tmp_path, gate, served):  # noqa: F811
    approvals, _ = evaluated(served.url, tmp_path, tau=1.0)  # every call held: escalate, or reject at low-risk tau
    assert {a.decision for a in approvals} <= {"escalate", "reject"} and len(approvals) == 2
    assert all("%" in a.explanation and "confidence gate" in a.explanation for a in approvals)


def test_the_docs_example_runs_as_written_and_the_log_keeps_each_approval(tmp_path, monkeypatch):
    (block,) = code_blocks("Inspect (approver)")
    monkeypatch.setenv("INSPECT_LOG_DIR", str(tmp_path))  # the block's eval() writes its log where it is told
    monkeypatch.setenv("INSPECT_DISPLAY", "none")
    task, model = scripted()
    with StandInGate(decision={"book_table": "allow", "cancel_booking": "deny"}, probability=0.42) as stand_in:
        run_block(block, {"TASK": task, "MODEL": model, "GATE_URL": stand_in.url}, "docs/hosts.md: Inspect")
    (log,) = [read_eval_log(info) for info in list_eval_logs(str(tmp_path))]
    approvals = gate_approvals(log)
    assert RAN == ["book_table Paris 2"] and len(stand_in.requests) == 2
    assert [(a.call.function, a.decision) for a in approvals] == [("book_table", "approve"),
                                                                    ("cancel_booking", "reject")]
    assert "(42%)" in approvals[1].explanation
