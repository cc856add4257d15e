"""The gate as a Claude Agent SDK / Claude Code ``PreToolUse`` hook: each tool call Claude proposes is scored
before the host's permission rules decide it.

What the host hands a hook (the SDK's ``PreToolUseHookInput``; Claude Code's hooks reference): the session's
``transcript_path`` (its JSON lines: the user's turns, Claude's replies with their ``tool_use`` blocks, the
``tool_result`` blocks), ``tool_name``, ``tool_input`` (the parsed arguments) and ``tool_use_id``; not the
tools' schemas. So :class:`GateHook` reads the conversation from the transcript (up to the reply that holds
this call) and shows the gate the schemas it was given (``tools=``: OpenAI's shape, or the SDK's ``@tool``
objects with their MCP names), or, for a tool it has none of, one made from the call's own arguments.

It answers ``deny`` (Claude reads why) or ``ask`` (the user decides) with the gate's probability in the
reason; a call the gate trusts is ``allow``ed, which in Claude's order (hooks, then deny rules, ask rules, the
permission mode, allow rules, ``canUseTool``) still meets the deny and ask rules, or, with ``trusted="defer"``,
no decision (the host's own flow decides). Two forms::

    hook = GateHook("http://127.0.0.1:8000", tools=[...])        # mice-exp serve
    ClaudeAgentOptions(hooks={"PreToolUse": [HookMatcher(matcher="mcp__shop__.*", hooks=[hook])]})

    {"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [{"type": "command",          # .claude/settings.json
        "command": "mice-exp claude-hook gate=http://127.0.0.1:8000 timeout=30", "timeout": 60}]}]}}
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

from mice_exp.errors import UserError
from mice_exp.hosts.scoring import Verdict, schema_of_call, scorer, tool_call, tool_schema

#: Seconds the hook waits for the gate by default: below the 60 s a HookMatcher (and an older Claude Code's
#: command hook) allows a hook, after which the host gives up on it.
HOOK_TIMEOUT = 50.0


class GateHook:
    """A ``PreToolUse`` hook (``HookMatcher(hooks=[hook])``, or the body of ``mice-exp claude-hook``) that asks a
    gate about each call: ``deny``, ``ask`` or ``allow`` (``trusted="defer"``: no decision) with its reason;
    no verdict within ``timeout`` seconds is ``deny``, unless ``fail_open``."""

    def __init__(self, gate: Any, *, tools: Iterable[Any] = (), tau: float | None = None,
                 timeout: float = HOOK_TIMEOUT, fail_open: bool = False,
                 trusted: Literal["allow", "defer"] = "allow") -> None:
        if trusted not in ("allow", "defer"):
            raise UserError(f"trusted={trusted!r}; expected 'allow' (the hook allows the calls the gate trusts) or "
                            "'defer' (the host's permission flow decides them)")
        self.scorer = scorer(gate, tau, timeout=timeout, fail_open=fail_open)
        self.tools = {schema["function"]["name"]: schema for schema in map(openai_tool, tools)}
        self.trusted = trusted

    async def __call__(self, input_data: Mapping[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        """The SDK's hook callback: ``(input_data, tool_use_id, context) -> HookJSONOutput``."""
        return await asyncio.to_thread(self.decide, input_data)

    def decide(self, hook_input: Mapping[str, Any]) -> dict[str, Any]:
        """The hook's JSON answer to one ``PreToolUse`` input."""
        return self.answer(self.verdict(hook_input))

    def verdict(self, hook_input: Mapping[str, Any]) -> Verdict:
        """The gate's verdict on the call the input holds (a request the gate refuses is denied with its reason)."""
        if hook_input.get("hook_event_name", "PreToolUse") != "PreToolUse":
            raise UserError(f"hook_event_name is {hook_input.get('hook_event_name')!r}; GateHook answers PreToolUse")
        name, arguments = hook_input["tool_name"], hook_input.get("tool_input") or {}
        call = tool_call(hook_input.get("tool_use_id") or f"{name}:{json.dumps(arguments, sort_keys=True)}", name,
                         arguments)
        tools = list(self.tools.values()) + ([] if name in self.tools else [schema_of_call(name, arguments)])
        messages = conversation(hook_input.get("transcript_path"), call["id"])
        try:
            (verdict,) = self.scorer.score_calls(messages, tools, [call])
        except UserError as error:  # the gate refused the request (a tool its prompt cannot show, ...)
            return Verdict(call_id=call["id"], name=name, execute=False, probability=None, tau=None, reason=str(error))
        return verdict

    def answer(self, verdict: Verdict) -> dict[str, Any]:
        """``hookSpecificOutput`` with ``permissionDecision`` and a reason holding the gate's probability."""
        if verdict.decision == "allow" and self.trusted == "defer":
            return {}
        reason = verdict.refusal() if verdict.decision == "deny" else verdict.explain()
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": verdict.decision,
                                       "permissionDecisionReason": reason}}


def openai_tool(tool: Any) -> dict[str, Any]:
    """A tool as OpenAI's chat schema: given so, or an ``SdkMcpTool`` (``@tool``) together with the name Claude
    calls it by (:func:`sdk_tools`), its MCP annotations kept (they set its tau)."""
    if isinstance(tool, Mapping):
        return dict(tool)
    if isinstance(tool, tuple) and len(tool) == 2 and hasattr(tool[1], "input_schema"):
        from claude_agent_sdk import _build_input_schema  # the JSON schema the SDK sends Claude for an @tool

        name, sdk = tool
        return tool_schema(name, sdk.description, _build_input_schema(sdk), sdk.annotations)
    raise UserError(f"tools holds {type(tool).__name__}; expected OpenAI's tool schema or an @tool object with "
                    "its name (sdk_tools(server, tools))")


def sdk_tools(server: str, tools: Sequence[Any]) -> list[tuple[str, Any]]:
    """The SDK's ``@tool`` objects served by ``create_sdk_mcp_server(name=server, tools=...)``, each with the
    name Claude calls it by (``mcp__<server>__<tool>``), for ``GateHook(tools=...)``."""
    return [(f"mcp__{server}__{t.name}", t) for t in tools]


def conversation(transcript: str | None, call_id: str) -> list[dict[str, Any]]:
    """The session's turns in OpenAI's chat shapes, read from Claude Code's transcript (JSON lines of
    ``{"type": "user" | "assistant", "message": {...}}``), up to the reply that proposed ``call_id``."""
    messages: list[dict[str, Any]] = []
    path = Path(transcript) if transcript else None
    lines = path.read_text(encoding="utf-8").splitlines() if path is not None and path.is_file() else []
    for line in lines:
        entry = json.loads(line) if line.strip() else {}
        message = entry.get("message") if entry.get("type") in ("user", "assistant") else None
        if not isinstance(message, Mapping):
            continue
        blocks = message.get("content")
        blocks = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else list(blocks or [])
        if any(b.get("type") == "tool_use" and b.get("id") == call_id for b in blocks):
            break  # the reply that holds this call: what the gate judges, not what it is told
        messages.extend(_turns(message.get("role", entry["type"]), blocks, messages))
    return messages


def _turns(role: str, blocks: list[dict[str, Any]], before: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One transcript message as chat turns; an assistant reply split over several lines joins the one before."""
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    if role == "assistant":
        calls = [tool_call(b["id"], b["name"], b.get("input") or {}) for b in blocks if b.get("type") == "tool_use"]
        if before and before[-1]["role"] == "assistant":
            before[-1]["content"] = (before[-1]["content"] or "") + text or None
            before[-1].setdefault("tool_calls", []).extend(calls)
            return []
        return [{"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}]
    results = [{"role": "tool", "tool_call_id": b["tool_use_id"], "content": _text(b.get("content"))}
               for b in blocks if b.get("type") == "tool_result"]
    return results + ([{"role": "user", "content": text}] if text else [])


def _text(content: Any) -> str:
    """A tool result's content as text (a string, or a list of text blocks)."""
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, Mapping))


def command(hook: GateHook, stdin: Any = None, stdout: Any = None) -> None:
    """``mice-exp claude-hook``: one hook input on stdin, its decision JSON on stdout. Anything that goes wrong
    is a ``deny`` with the reason (a command hook that fails otherwise lets the call run)."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    try:
        answer = hook.decide(json.loads(stdin.read()))
    except Exception as error:  # noqa: BLE001 - fail-closed: the host must not read a crash as "no objection"
        why = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}"
        answer = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                         "permissionDecisionReason": f"The confidence gate's hook failed: {why}."}}
    stdout.write(json.dumps(answer) + "\n")
