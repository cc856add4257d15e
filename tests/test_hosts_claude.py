"""The gate as a Claude Agent SDK / Claude Code ``PreToolUse`` hook, fed what a session hands a hook (no Claude
API call): the hook input of the SDK's own types, a transcript in Claude Code's JSON lines, the SDK's
``@tool`` served by ``create_sdk_mcp_server``. Both forms: the callback a ``HookMatcher`` holds, and the
``mice-exp claude-hook`` command (stdin in, decision JSON out).

Which of deny / ask / allow the hook answers is shown with a stand-in gate that gives each (the tiny test gate's
probabilities are 0 or 1); the probability the real gate gives runs against test_hosts' served gate.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex
import subprocess
import sys
import time

import pytest

pytest.importorskip("claude_agent_sdk", reason="the Claude host needs claude-agent-sdk (the claude extra)")

from claude_agent_sdk import ClaudeAgentOptions, HookMatcher, create_sdk_mcp_server, tool  # noqa: E402
from claude_agent_sdk.types import HookContext, PreToolUseHookInput, PreToolUseHookSpecificOutput  # noqa: E402

from mice_exp.hosts.claude_hooks import GateHook, command, conversation, sdk_tools  # noqa: E402
from mice_exp.hosts.scoring import tool_call  # noqa: E402
from mice_exp.paths import PACKAGE_ROOT  # noqa: E402
from tests.doc_blocks import code_blocks, run_block  # noqa: E402
from tests.stand_in_gate import TIMEOUT, StandInGate, unavailable  # noqa: E402, F401 - unavailable: a fixture
from tests.test_gate import fitted  # noqa: E402, F401 - test_gate's saved tiny_random gate
from tests.test_hosts import gate, served  # noqa: E402, F401 - the gate loaded from it, and mice-exp serve on it

pytestmark = pytest.mark.timeout(300)
QUESTION = "Book a table for two in Paris, then check the weather there."
BOOK = "mcp__shop__book_table"


@tool("book_table", "Book a restaurant table.", {"city": str, "people": int})
async def book_table(args: dict) -> dict:
    return {"content": [{"type": "text", "text": f"Booked for {args['people']} in {args['city']}"}]}


SHOP = sdk_tools("shop", [book_table])


def session(tmp_path, arguments: dict, tool_use_id: str = "toolu_02") -> PreToolUseHookInput:
    """What Claude Code hands the hook for a second call, after a first one (get_weather) ran: the transcript
    holds the question, the first call and its result, then the reply with this call."""
    lines = [{"type": "user", "message": {"role": "user", "content": QUESTION}},
             {"type": "assistant", "message": {"id": "msg_1", "role": "assistant", "content": [
                 {"type": "text", "text": "Checking the weather first."},
                 {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]}},
             {"type": "user", "message": {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "Sunny"}]}]}},
             {"type": "assistant", "message": {"id": "msg_2", "role": "assistant", "content": [
                 {"type": "tool_use", "id": tool_use_id, "name": BOOK, "input": arguments}]}}]
    path = tmp_path / "session.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return PreToolUseHookInput(session_id="s1", transcript_path=str(path), cwd=str(tmp_path),
                               permission_mode="default", hook_event_name="PreToolUse", tool_name=BOOK,
                               tool_input=arguments, tool_use_id=tool_use_id)


def hooked(hook: GateHook, hook_input: PreToolUseHookInput) -> dict:
    """The hook as the SDK calls it: registered in ClaudeAgentOptions through a HookMatcher, then awaited."""
    options = ClaudeAgentOptions(mcp_servers={"shop": create_sdk_mcp_server("shop", tools=[book_table])},
                                 hooks={"PreToolUse": [HookMatcher(matcher="mcp__shop__.*", hooks=[hook])]})
    return pre_tool_use(options, hook_input)


def pre_tool_use(options: ClaudeAgentOptions, hook_input: PreToolUseHookInput) -> dict:
    """What the options' PreToolUse hook answers for this input, called as Claude calls it: the one hook of the
    one matcher, which must match the call's tool name."""
    (matcher,) = options.hooks["PreToolUse"]
    assert re.fullmatch(matcher.matcher, hook_input["tool_name"]), matcher.matcher
    (callback,) = matcher.hooks
    return asyncio.run(callback(hook_input, hook_input["tool_use_id"], HookContext(signal=None)))


def test_the_hook_reads_the_conversation_from_the_transcript(tmp_path):
    hook_input = session(tmp_path, {"city": "Paris", "people": 2})
    assert conversation(hook_input["transcript_path"], "toolu_02") == [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "Checking the weather first.",
         "tool_calls": [tool_call("toolu_01", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "toolu_01", "content": "Sunny"}]


@pytest.mark.parametrize("decision", ["allow", "ask", "deny"])
def test_the_hook_answers_the_gates_decision_with_its_probability_in_the_reason(tmp_path, decision):
    with StandInGate(decision=decision, probability=0.42) as stand_in:
        answer = hooked(GateHook(stand_in.url, tools=SHOP), session(tmp_path, {"city": "Paris", "people": 2}))
    output = answer["hookSpecificOutput"]
    assert set(answer) == {"hookSpecificOutput"} and set(output) <= set(PreToolUseHookSpecificOutput.__annotations__)
    assert (output["hookEventName"], output["permissionDecision"]) == ("PreToolUse", decision)
    assert "(42%)" in output["permissionDecisionReason"] or "a 42% chance" in output["permissionDecisionReason"]
    (request,) = stand_in.requests
    assert [m["role"] for m in request["messages"]] == ["user", "assistant", "tool"]
    (shown,) = request["tools"]  # the @tool's schema, under the name Claude calls it by
    assert shown["function"]["name"] == BOOK and shown["function"]["parameters"]["properties"] == {
        "city": {"type": "string"}, "people": {"type": "integer"}}


def test_a_trusted_call_can_be_left_to_the_hosts_own_permission_flow(tmp_path):
    with StandInGate(decision="allow") as stand_in:
        assert hooked(GateHook(stand_in.url, tools=SHOP, trusted="defer"), session(tmp_path, {"city": "Paris"})) == {}


def test_a_replayed_call_gets_the_same_answer_without_asking_the_gate_again(tmp_path):
    with StandInGate(decision="ask") as stand_in:
        hook = GateHook(stand_in.url, tools=SHOP)
        first = hooked(hook, session(tmp_path, {"city": "Paris", "people": 2}))
        assert hooked(hook, session(tmp_path, {"city": "Paris", "people": 2})) == first
        assert len(stand_in.requests) == 1


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail-closed", "fail-open"])
def test_the_hook_denies_when_the_gate_gives_no_verdict_unless_told_to_fail_open(tmp_path, unavailable, fail_open):
    start = time.perf_counter()
    answer = hooked(GateHook(unavailable, tools=SHOP, timeout=TIMEOUT, fail_open=fail_open),
                    session(tmp_path, {"city": "Paris", "people": 2}))
    assert time.perf_counter() - start < TIMEOUT + 10  # the slow stand-in would take 30 s
    output = answer["hookSpecificOutput"]
    assert output["permissionDecision"] == ("allow" if fail_open else "deny")
    assert ("runs unscored" if fail_open else "fail-closed") in output["permissionDecisionReason"]


def test_the_hook_gives_the_probability_the_gate_gives(tmp_path, gate, served):  # noqa: F811
    hook_input = session(tmp_path, {"city": "Paris", "people": 2})
    hook = GateHook(served.url, tools=SHOP, tau=1.0)  # every call held: ask, or deny at the low-risk tau
    (verdict,) = hook.scorer.scorer.score_calls(conversation(hook_input["transcript_path"], "toolu_02"),
                                                list(hook.tools.values()),
                                                [tool_call("toolu_02", BOOK, hook_input["tool_input"])])
    output = hooked(hook, hook_input)["hookSpecificOutput"]
    assert output["permissionDecision"] == verdict.decision and output["permissionDecisionReason"] in (
        verdict.explain(), verdict.refusal())
    assert f"{verdict.probability:.0%}" in output["permissionDecisionReason"]


def test_the_command_reads_the_hook_json_and_prints_the_decision(tmp_path):
    hook_input = session(tmp_path, {"city": "Paris", "people": 2})
    (tmp_path / "tools.json").write_text(json.dumps([GateHook("http://127.0.0.1:9", tools=SHOP).tools[BOOK]]))
    with StandInGate(decision="deny", probability=0.05) as stand_in:
        done = subprocess.run([sys.executable, "-m", "mice_exp", "claude-hook", f"gate={stand_in.url}",
                               f"tools={tmp_path / 'tools.json'}"], input=json.dumps(hook_input),
                              capture_output=True, text=True, cwd=PACKAGE_ROOT, timeout=240)
    assert done.returncode == 0, done.stderr
    output = json.loads(done.stdout)["hookSpecificOutput"]
    assert output["permissionDecision"] == "deny" and "(5%)" in output["permissionDecisionReason"]
    assert stand_in.requests[0]["tools"][0]["function"]["name"] == BOOK


def test_the_command_denies_input_it_cannot_read():
    out = io.StringIO()
    command(GateHook("http://127.0.0.1:9"), stdin=io.StringIO("not json"), stdout=out)
    output = json.loads(out.getvalue())["hookSpecificOutput"]
    assert output["permissionDecision"] == "deny" and "JSONDecodeError" in output["permissionDecisionReason"]


# ---------------------------------------------------------------------- docs/hosts.md
SECTION = "Claude Agent SDK and Claude Code (`PreToolUse` hook)"


def right_or_wrong(call: dict) -> str:
    """The stand-in's verdict: a table for two (what the session asked for) is allowed, any other is denied."""
    return "allow" if json.loads(call["function"]["arguments"]) == {"city": "Paris", "people": 2} else "deny"


def test_the_docs_hook_example_runs_as_written_and_decides_each_call(tmp_path):
    (block,) = code_blocks(SECTION)
    with StandInGate(decision=right_or_wrong, probability=0.42) as stand_in:
        namespace = {"GATE_URL": stand_in.url}
        run_block(block, namespace, f"docs/hosts.md: {SECTION}")
        right = pre_tool_use(namespace["options"], session(tmp_path, {"city": "Paris", "people": 2}))
        wrong = pre_tool_use(namespace["options"], session(tmp_path, {"city": "Paris", "people": 20}, "toolu_03"))
    assert right["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert wrong["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "(42%)" in wrong["hookSpecificOutput"]["permissionDecisionReason"]
    assert [r["tools"][0]["function"]["name"] for r in stand_in.requests] == [BOOK, BOOK]  # sdk_tools' schema
    assert stand_in.requests[0]["tools"][0]["function"]["parameters"]["properties"]["people"] == {"type": "integer"}


def test_the_docs_claude_code_settings_run_the_hook_command(tmp_path):
    """The settings JSON as written: a command hook whose own timeout is above the guard's, and whose command
    (run here with this interpreter, at a stand-in gate's URL) denies the call the gate denies."""
    (block,) = code_blocks(SECTION, "json")
    (matcher,) = json.loads(block)["hooks"]["PreToolUse"]
    (hook,) = matcher["hooks"]
    argv = shlex.split(hook["command"])
    assert (matcher["matcher"], hook["type"], argv[:2]) == ("*", "command", ["mice-exp", "claude-hook"])
    options = dict(a.split("=", 1) for a in argv[2:])
    assert set(options) == {"gate", "timeout"} and float(options["timeout"]) < hook["timeout"]
    with StandInGate(decision=right_or_wrong, probability=0.05) as stand_in:
        argv = [sys.executable, "-m", "mice_exp", *(f"gate={stand_in.url}" if a.startswith("gate=") else a
                                                    for a in argv[1:])]
        done = subprocess.run(argv, input=json.dumps(session(tmp_path, {"city": "Paris", "people": 20})),
                              capture_output=True, text=True, cwd=PACKAGE_ROOT, timeout=240)
    assert done.returncode == 0, done.stderr
    output = json.loads(done.stdout)["hookSpecificOutput"]
    assert output["permissionDecision"] == "deny" and "(5%)" in output["permissionDecisionReason"]
    (request,) = stand_in.requests
    assert request["tools"][0]["function"]["name"] == BOOK  # no tools= file: the call's own arguments' schema
