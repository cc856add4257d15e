"""What a host hands the gate, and what it gets back.

A host (an agent framework) has the conversation, the tools and the calls its own model proposed; the gate
scores those calls, it does not make its own. Both hosts convert their messages and tools to OpenAI's chat
shapes and ask a :class:`Scorer` for one :class:`Verdict` per call, either in-process (a loaded
:class:`mice_exp.gate.Gate`, through ``Gate.score_batch``) or over HTTP (``POST /v1/tool_calls/check`` on
``mice-exp serve``). Torch-free: the HTTP path needs no model on the agent's machine.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, Sequence

from mice_exp.errors import UserError

Messages = Sequence[dict[str, Any]]
Tools = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class Verdict:
    """The gate's answer on one proposed call, as a host acts on it.

    ``execute`` is the gate's decision: its calibrated ``probability`` above ``tau``, for a call it can run; a
    call it never runs (a tool not offered, arguments that do not fit the tool's schema; over HTTP also one at
    or below the low-risk threshold) has ``reason`` set. ``arguments`` maps each top-level argument to the
    gate's probability of its value.
    """

    call_id: str
    name: str
    execute: bool
    probability: float | None  # None: denied before scoring (``reason`` says why)
    tau: float
    arguments: dict[str, float] = field(default_factory=dict)
    reason: str | None = None

    @property
    def least_certain(self) -> str | None:
        """The argument the gate was least sure of: what to ask the user about."""
        return min(self.arguments, key=self.arguments.__getitem__) if self.arguments else None

    def explain(self) -> str:
        """The gate's view in one line, for a reviewer."""
        if self.reason:
            odds = "" if self.probability is None else f" ({self.probability:.0%})"
            return f"The confidence gate refused the call to {self.name}{odds}: {self.reason}."
        doubt = f"; least certain argument: {self.least_certain}" if self.least_certain else ""
        return (f"The confidence gate gives this call to {self.name} a {self.probability:.0%} chance of being right "
                f"(threshold {self.tau:.0%}){doubt}.")

    def refusal(self) -> str:
        """What the model reads in place of a held call's result."""
        return self.explain() + " The tool was not run: ask the user to confirm or correct the call first."

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (what a framework's state can store and a checkpointer can save)."""
        return asdict(self)


class Scorer(Protocol):
    """Scores the calls a model proposed in reply to ``messages`` with ``tools`` offered, one verdict each."""

    def score_calls(self, messages: Messages, tools: Tools, calls: Sequence[dict[str, Any]]) -> list[Verdict]: ...


def tool_call(call_id: str, name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
    """A call in OpenAI's chat shape (``arguments`` a JSON string, as the model wrote it)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"type": "function", "id": call_id, "function": {"name": name, "arguments": text}}


class GateScorer:
    """Scores in this process with a loaded gate: one teacher-forced pass per call, no generation."""

    def __init__(self, gate: Any, tau: float | None = None) -> None:
        self.gate, self.tau = gate, tau

    def score_calls(self, messages: Messages, tools: Tools, calls: Sequence[dict[str, Any]]) -> list[Verdict]:
        decisions = self.gate.score_batch([(messages, tools, call) for call in calls], tau=self.tau)
        return [Verdict(call_id=call["id"], name=call["function"]["name"], execute=bool(d.execute),
                        probability=d.probability, tau=d.tau, arguments=dict(d.arguments), reason=d.reason)
                for call, d in zip(calls, decisions)]


class HttpScorer:
    """Scores over HTTP with ``mice-exp serve``'s ``POST /v1/tool_calls/check`` (OpenAI's chat request with the
    proposed ``tool_calls``); the agent's process needs neither torch nor the gate's model."""

    def __init__(self, url: str, tau: float | None = None, timeout: float = 300.0) -> None:
        self.url = url.rstrip("/").removesuffix("/v1") + "/v1/tool_calls/check"
        self.tau, self.timeout = tau, timeout

    def score_calls(self, messages: Messages, tools: Tools, calls: Sequence[dict[str, Any]]) -> list[Verdict]:
        body: dict[str, Any] = {"messages": list(messages), "tools": list(tools), "tool_calls": list(calls)}
        if self.tau is not None:
            body["mice_exp"] = {"tau": self.tau}
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer = _results(self.url, response.read(), len(calls))
        except urllib.error.HTTPError as error:
            message = json.loads(error.read() or b"{}").get("error", {}).get("message", error.reason)
            raise UserError(f"the gate at {self.url} refused the calls (HTTP {error.code}): {message}") from None
        except urllib.error.URLError as error:
            raise UserError(f"the gate at {self.url} cannot be reached ({error.reason}); expected `mice-exp serve` "
                            "listening there") from None
        except TimeoutError:
            raise UserError(f"the gate at {self.url} did not answer within {self.timeout:g} s; expected a longer "
                            "timeout= for a gate this slow, or fewer requests at once") from None
        return [Verdict(call_id=call["id"], name=call["function"]["name"], execute=result["decision"] == "allow",
                        probability=result["probability"], tau=result["tau"], arguments=result.get("arguments") or {},
                        reason=result.get("reason"))
                for call, result in zip(calls, answer)]


def _results(url: str, body: bytes, n_calls: int) -> list[dict[str, Any]]:
    """The verdicts of ``/v1/tool_calls/check``'s answer, or one line saying that whatever answered is not the gate."""
    try:
        answer = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        answer = None
    results = answer.get("results") if isinstance(answer, dict) else None
    keys = ("decision", "probability", "tau")
    if not isinstance(results, list) or len(results) != n_calls or not all(
            isinstance(r, dict) and all(k in r for k in keys) for r in results):
        raise UserError(f"{url} answered {body[:60]!r}, not the verdicts of mice-exp serve's /v1/tool_calls/check "
                        f"(a JSON object whose 'results' hold {n_calls} {{decision, probability, tau}}); expected the "
                        "URL of mice-exp serve")
    return results


def scorer(gate: Any, tau: float | None = None) -> Scorer:
    """The scorer for ``gate``: a loaded :class:`~mice_exp.gate.Gate`, the URL of ``mice-exp serve``, or a
    :class:`Scorer` already."""
    if isinstance(gate, str):
        if not gate.startswith(("http://", "https://")):
            raise UserError(f"gate={gate!r}; expected a loaded Gate (Gate.load(...)) or the http:// URL of "
                            "`mice-exp serve`")
        return HttpScorer(gate, tau)
    if hasattr(gate, "score_batch"):
        return GateScorer(gate, tau)
    if hasattr(gate, "score_calls"):
        return gate
    raise UserError(f"gate={type(gate).__name__}; expected a loaded Gate, the URL of `mice-exp serve` or a Scorer")
