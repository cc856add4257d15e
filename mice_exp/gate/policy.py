"""The confirm / hold policy: what the server does with a call at or below tau, and how a judged call is decided.

A held call is written into the assistant's message (:func:`held_message`), so a framework that keeps only
the text keeps the call; a next user turn that approves it gets it back (:func:`held_call`) without the LLM.
A call another model made is allowed, asked about or denied at its tool's risk (:class:`ToolRisk`,
:func:`verdict`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from mice_exp.gate.chat import Call, Decision, InvalidRequest

#: What the server does with a call at or below the threshold.
ON_ABSTAIN = ("confirm", "refuse", "pass")
#: The words that approve a held call (the whole reply: at most four words, none a "no").
APPROVALS = frozenset({"yes", "y", "yeah", "yep", "ok", "okay", "sure", "go", "proceed", "approve", "approved",
                       "confirm", "confirmed", "do"})
_DENIALS = frozenset({"no", "not", "don", "dont", "stop", "wait", "cancel"})
_HELD = re.compile(r"\A(?:Before I call|Shall I call) ")
_ODDS = re.compile(r"gives this call a (\d+)% chance")


def check_on_abstain(value: Any, param: str = "on_abstain") -> str:
    if value not in ON_ABSTAIN:
        raise InvalidRequest(f"{param}={value!r}; expected one of {', '.join(ON_ABSTAIN)}", param=param)
    return value


def written(call: Call) -> str:
    """A call as the held message writes it, ``name({"argument": value})``, which :func:`held_call` reads back."""
    return f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})"


def held_message(decision: Decision, on_abstain: str) -> str:
    """The assistant's words for a call the gate holds: a question about its least certain argument, or a
    refusal; either holds the whole call, so a framework that keeps only the text keeps the call."""
    call = decision.call
    assert call is not None
    odds = (f"the gate gives this call a {decision.probability:.0%} chance of being correct, "
            f"at or below the {decision.tau:.0%} it needs to act on its own")
    if on_abstain == "refuse":
        return f"I did not call {written(call)}: {odds}."
    doubt = decision.least_certain
    if doubt is None:
        return f"Shall I call {written(call)}? I am not sure: {odds}. Reply yes to go ahead."
    value = json.dumps(call.arguments.get(doubt), ensure_ascii=False)
    return (f"Before I call {written(call)}: did you mean {doubt} = {value}? I am least sure of that argument "
            f"({decision.arguments[doubt]:.0%} for its value), and {odds}. Reply yes to go ahead, "
            f"or give the right {doubt}.")


def held_call(messages: Sequence[Mapping[str, Any]]) -> tuple[Call, float] | None:
    """The call a conversation's user approves: its last message a short "yes" (:data:`APPROVALS`) right after
    an assistant message of :func:`held_message`'s ``confirm`` form; the call and the probability it was held at."""
    if len(messages) < 2 or messages[-1].get("role") != "user" or messages[-2].get("role") != "assistant":
        return None
    reply, held = messages[-1].get("content"), messages[-2].get("content")
    if not isinstance(reply, str) or not isinstance(held, str) or not _HELD.match(held):
        return None
    words = re.findall(r"[a-z]+", reply.lower())
    if not 0 < len(words) <= 4 or words[0] not in APPROVALS or _DENIALS & set(words):
        return None
    rest = held[_HELD.match(held).end():]
    start = rest.find("({")
    try:
        arguments, _ = json.JSONDecoder().raw_decode(rest, start + 1)
    except (ValueError, json.JSONDecodeError):
        return None
    odds = _ODDS.search(held)
    return Call(rest[:start], arguments), (int(odds.group(1)) / 100 if odds else 0.0)


@dataclass(frozen=True)
class ToolRisk:
    """The threshold a judged call is decided at, per tool: from its MCP annotations (``destructiveHint: true``:
    the high-risk tau; ``readOnlyHint: true``: the low-risk tau), else the per-tool map of the config, else the
    gate's. A call at or below the low-risk tau is denied outright (no risk setting would make it)."""

    high: float = 0.9  # conf/risk/high.yaml
    low: float = 0.1  # conf/risk/low.yaml
    tools: Mapping[str, float] = field(default_factory=dict)

    def tau(self, tool: Mapping[str, Any], default: float) -> tuple[float, str]:
        """The tool's tau and where it came from (``destructiveHint``, ``readOnlyHint``, ``config``, ``gate``)."""
        annotations = tool.get("annotations") or tool["function"].get("annotations") or {}
        if not isinstance(annotations, Mapping):
            raise InvalidRequest(f"the annotations of tool {tool['function']['name']!r} are "
                                 f"{json.dumps(annotations)[:40]}; expected MCP's object of hints "
                                 '({"readOnlyHint": true, "destructiveHint": false, ...})', param="tools")
        if annotations.get("destructiveHint") is True:
            return self.high, "destructiveHint"
        if annotations.get("readOnlyHint") is True:
            return self.low, "readOnlyHint"
        name = tool["function"]["name"]
        return (float(self.tools[name]), "config") if name in self.tools else (default, "gate")


def at_tau(decision: Decision, tau: float) -> Decision:
    """The decision at another threshold (the probability does not change)."""
    return replace(decision, tau=tau, execute=decision.call is not None and decision.probability > tau)


def verdict(decision: Decision, index: int, ident: str | None, name: str, tau: float, source: str,
            low: float) -> dict[str, Any]:
    """One judged call: ``allow`` (p > tau), ``deny`` (not a valid call of an offered tool, or p at or below the
    low-risk tau), else ``ask`` about its least certain argument (``question``: what to ask the user)."""
    reason = getattr(decision, "reason", None) or (decision.parse_error if decision.call is None else None)
    p = decision.probability
    if reason is not None or decision.call is None:
        verdict_, reason = "deny", reason or "the call does not parse"
    elif p > tau:
        verdict_ = "allow"
    elif p <= low:
        verdict_, reason = "deny", f"p = {p:.3f} is at or below the low-risk tau {low:g}"
    else:
        verdict_ = "ask"
    doubt = decision.least_certain if verdict_ == "ask" else None
    question = None
    if verdict_ == "ask":
        question = held_message(at_tau(decision, tau), "confirm")
    return {"index": index, "id": ident, "name": name, "decision": verdict_, "probability": p, "tau": tau,
            "risk": source, "arguments": decision.arguments, "ask_about": doubt, "question": question,
            "reason": reason}
