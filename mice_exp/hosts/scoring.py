"""What a host hands the gate, and what it gets back.

A host (an agent framework) has the conversation, the tools and the calls its own model proposed; the gate
scores those calls, it does not make its own. Every host converts its messages and tools to OpenAI's chat
shapes and asks a :class:`Scorer` for one :class:`Verdict` per call, either in-process (a loaded
:class:`mice_exp.gate.Gate`, through ``Gate.score_batch``) or over HTTP (``POST /v1/tool_calls/check`` on
``mice-exp serve``). Torch-free: the HTTP path needs no model on the agent's machine.

Every adapter asks through :class:`Guarded` (what :func:`scorer` returns): each call id is decided once, so a
host that replays a call (LangChain's approval predicate on resume, a retried hook) gets the same answer, and
a gate that does not answer (unreachable, slower than ``timeout``, or answering something that is not its
verdicts) decides no call: the call is denied (fail-closed) unless the host chose ``fail_open=True``.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence, TypeVar

from mice_exp.errors import UserError

Messages = Sequence[dict[str, Any]]
Tools = Sequence[dict[str, Any]]
T = TypeVar("T")

#: Seconds a guard waits for the gate by default (a CPU gate on a loaded machine can take minutes per call).
TIMEOUT = 300.0


class GateUnavailable(UserError):
    """The gate gave no verdict: unreachable, slower than the timeout, overloaded, or something else answered.
    What ``fail_open`` decides on; a request the gate refuses as invalid is a plain :class:`UserError`."""


@dataclass(frozen=True)
class Verdict:
    """The gate's answer on one proposed call, as a host acts on it.

    ``execute`` is the gate's decision: its calibrated ``probability`` above ``tau``, for a call it can run; a
    call it never runs (a tool not offered, arguments that do not fit the tool's schema; over HTTP also one at
    or below the low-risk threshold) has ``reason`` set. ``arguments`` maps each top-level argument to the
    gate's probability of its value. A call the gate did not score (it gave no verdict) has no probability
    and no tau, and ``reason`` says why: denied, or run where the host chose ``fail_open``.
    """

    call_id: str
    name: str
    execute: bool
    probability: float | None  # None: denied before scoring, or not scored at all (``reason`` says why)
    tau: float | None  # None: not scored
    arguments: dict[str, float] = field(default_factory=dict)
    reason: str | None = None

    @property
    def decision(self) -> Literal["allow", "ask", "deny"]:
        """What a host that can ask a person does: run the call, ask (the gate doubts it: ``p`` at or below
        ``tau``), or refuse it (a call that cannot run, one at or below the low-risk tau, or no verdict)."""
        if self.execute:
            return "allow"
        return "deny" if self.reason else "ask"

    @property
    def least_certain(self) -> str | None:
        """The argument the gate was least sure of: what to ask the user about."""
        return min(self.arguments, key=self.arguments.__getitem__) if self.arguments else None

    def explain(self) -> str:
        """The gate's view in one line, for a reviewer."""
        if self.execute and self.reason:  # fail-open: the gate gave no verdict
            return f"The confidence gate did not score the call to {self.name} ({self.reason}); it runs unscored."
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


def tool_schema(name: str, description: str | None, parameters: Mapping[str, Any], hints: Any = None
                ) -> dict[str, Any]:
    """A tool in OpenAI's chat shape; ``hints``: its MCP ``ToolAnnotations`` (``readOnlyHint`` and
    ``destructiveHint`` set its tau), or None."""
    return annotated({"type": "function", "function": {"name": name, "description": description or "",
                                                      "parameters": dict(parameters)}}, hints)


def annotated(schema: Mapping[str, Any], hints: Any) -> dict[str, Any]:
    """A tool schema with its MCP ``ToolAnnotations`` beside ``function``, where ``/v1/tool_calls/check`` and
    :class:`GateScorer` read them (None: the schema as it is)."""
    return dict(schema) if hints is None else {**schema, "annotations": hints.model_dump(by_alias=True,
                                                                                         exclude_none=True)}


#: The JSON types of Python values, for a tool the host shows no schema of.
_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
               (dict, "object"))


def json_type(value: Any) -> str:
    """The JSON type of a value, or of a Python type."""
    kind = value if isinstance(value, type) else type(value)
    return next((name for python, name in _JSON_TYPES if issubclass(kind, python)), "string")


def schema_of_call(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A schema for a tool the host shows the guard none of: the call's own arguments, each of its value's type
    (so the gate judges the values, not whether they fit)."""
    return tool_schema(name, "", {"type": "object", "properties": {k: {"type": json_type(v)} for k, v in
                                                                   arguments.items()}, "required": list(arguments)})


def tool_call(call_id: str, name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
    """A call in OpenAI's chat shape (``arguments`` a JSON string, as the model wrote it)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"type": "function", "id": call_id, "function": {"name": name, "arguments": text}}


class GateScorer:
    """Scores in this process with a loaded gate: one teacher-forced pass per call, no generation. Without
    ``tau`` each call is decided at its tool's risk as ``/v1/tool_calls/check`` decides it (``risk``, default
    :class:`~mice_exp.gate.policy.ToolRisk`'s: ``destructiveHint`` the high-risk tau, ``readOnlyHint`` the
    low-risk one, else the gate's tau); ``tau`` decides every call at that threshold."""

    def __init__(self, gate: Any, tau: float | None = None, risk: Any = None) -> None:
        self.gate, self.tau, self.risk = gate, tau, risk

    def score_calls(self, messages: Messages, tools: Tools, calls: Sequence[dict[str, Any]]) -> list[Verdict]:
        decisions = self.gate.score_batch([(messages, tools, call) for call in calls], tau=self.tau)
        if self.tau is None:
            from mice_exp.gate.policy import ToolRisk, at_tau  # loads numpy, omegaconf (a guard imports no gate code)

            risk, by_name = self.risk or ToolRisk(), {t["function"]["name"]: t for t in tools}
            decisions = [at_tau(d, risk.tau(by_name[name], d.tau)[0]) if (name := c["function"]["name"]) in by_name
                         else d for c, d in zip(calls, decisions)]
        return [Verdict(call_id=call["id"], name=call["function"]["name"], execute=bool(d.execute),
                        probability=d.probability, tau=d.tau, arguments=dict(d.arguments), reason=d.reason)
                for call, d in zip(calls, decisions)]


class HttpScorer:
    """Scores over HTTP with ``mice-exp serve``'s ``POST /v1/tool_calls/check`` (OpenAI's chat request with the
    proposed ``tool_calls``); the agent's process needs neither torch nor the gate's model."""

    def __init__(self, url: str, tau: float | None = None, timeout: float = TIMEOUT) -> None:
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
            message = _error_message(error.read()) or error.reason
            failed = GateUnavailable if error.code == 429 or error.code >= 500 else UserError
            raise failed(f"the gate at {self.url} refused the calls (HTTP {error.code}): {message}") from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                raise _late(self.url, self.timeout) from None
            raise GateUnavailable(f"the gate at {self.url} cannot be reached ({error.reason}); expected "
                                  "`mice-exp serve` listening there") from None
        except TimeoutError:
            raise _late(self.url, self.timeout) from None
        return [Verdict(call_id=call["id"], name=call["function"]["name"], execute=result["decision"] == "allow",
                        probability=result["probability"], tau=result["tau"], arguments=result.get("arguments") or {},
                        reason=result.get("reason"))
                for call, result in zip(calls, answer)]


def _late(where: str, seconds: float) -> GateUnavailable:
    return GateUnavailable(f"the gate at {where} did not answer within {seconds:g} s; expected a longer timeout= "
                           "for a gate this slow, or fewer requests at once")


def _error_message(body: bytes) -> str | None:
    """The message of OpenAI's error body, or None where the body is not one."""
    try:
        error = json.loads(body).get("error")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    return error.get("message") if isinstance(error, dict) else None


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
        raise GateUnavailable(f"{url} answered {body[:60]!r}, not the verdicts of mice-exp serve's "
                              f"/v1/tool_calls/check (a JSON object whose 'results' hold {n_calls} {{decision, "
                              "probability, tau}); expected the URL of mice-exp serve")
    return results


class Guarded:
    """A scorer as every host uses it: each call decided once (by call id, so a replayed call gets the verdict it
    got the first time), within ``timeout`` seconds; where the gate gives no verdict (:class:`GateUnavailable`,
    or no answer in time) the calls are denied, or run unscored with ``fail_open=True``, and the verdict says
    why. A call id seen again with another name or other arguments is scored anew."""

    #: Verdicts kept (the oldest forgotten first): a long-lived guard (an MCP proxy) does not grow without end.
    KEPT = 100_000

    def __init__(self, scorer: Scorer, timeout: float = TIMEOUT, fail_open: bool = False) -> None:
        if not timeout > 0:
            raise UserError(f"timeout={timeout!r}; expected the seconds a guard waits for the gate (> 0)")
        self.scorer, self.timeout, self.fail_open = scorer, float(timeout), bool(fail_open)
        self.verdicts: OrderedDict[str, Verdict] = OrderedDict()  # by call id
        self._calls: dict[str, tuple[str, Any]] = {}  # by call id: the name and parsed arguments decided on
        self._lock = threading.Lock()

    def score_calls(self, messages: Messages, tools: Tools, calls: Sequence[dict[str, Any]]) -> list[Verdict]:
        with self._lock:
            new = [c for c in calls if self._calls.get(c["id"]) != _what(c)]
        if new:
            try:
                verdicts = within(self.timeout, self.scorer.score_calls, messages, tools, new)
            except GateUnavailable as error:
                verdicts = [self.unscored(c, str(error)) for c in new]
            with self._lock:
                for call, verdict in zip(new, verdicts):
                    self.verdicts[call["id"]] = verdict
                    self.verdicts.move_to_end(call["id"])
                    self._calls[call["id"]] = _what(call)
                while len(self.verdicts) > self.KEPT:
                    self._calls.pop(self.verdicts.popitem(last=False)[0], None)
        with self._lock:
            return [self.verdicts[c["id"]] for c in calls]

    def unscored(self, call: dict[str, Any], why: str) -> Verdict:
        """The verdict on a call the gate gave no verdict on: denied, or run where the host chose fail-open."""
        policy = "fail_open=True" if self.fail_open else (
            "fail-closed: no call runs without the gate's verdict (fail_open=True runs them unscored)")
        return Verdict(call_id=call["id"], name=call["function"]["name"], execute=self.fail_open, probability=None,
                       tau=None, reason=f"{why}; {policy}")


def _what(call: dict[str, Any]) -> tuple[str, Any]:
    """A call's name and parsed arguments (its text where it does not parse): what its id stands for."""
    text = call["function"].get("arguments", "")
    try:
        return call["function"]["name"], json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return call["function"]["name"], text


def within(seconds: float, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)``'s answer, or :class:`GateUnavailable` once ``seconds`` pass (the work goes on in a daemon
    thread, which neither the host's event loop nor the interpreter's exit waits for)."""
    done, answer = threading.Event(), {}

    def run() -> None:
        try:
            answer["value"] = work(*args)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            answer["error"] = error
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="mice_exp-gate").start()
    if not done.wait(seconds):
        raise GateUnavailable(f"the gate did not answer within {seconds:g} s; expected a longer timeout= for a gate "
                              "this slow")
    if "error" in answer:
        raise answer["error"]
    return answer["value"]


def scorer(gate: Any, tau: float | None = None, *, timeout: float = TIMEOUT, fail_open: bool = False) -> Guarded:
    """The guarded scorer for ``gate``: a loaded :class:`~mice_exp.gate.Gate`, the URL of ``mice-exp serve``, or
    a :class:`Scorer` already; ``timeout`` and ``fail_open`` as :class:`Guarded` takes them."""
    if isinstance(gate, Guarded):
        return gate
    if isinstance(gate, str):
        if not gate.startswith(("http://", "https://")):
            raise UserError(f"gate={gate!r}; expected a loaded Gate (Gate.load(...)) or the http:// URL of "
                            "`mice-exp serve`")
        inner: Scorer = HttpScorer(gate, tau, timeout)
    elif hasattr(gate, "score_batch"):
        inner = GateScorer(gate, tau)
    elif hasattr(gate, "score_calls"):
        inner = gate
    else:
        raise UserError(f"gate={type(gate).__name__}; expected a loaded Gate, the URL of `mice-exp serve` or a "
                        "Scorer")
    return Guarded(inner, timeout, fail_open)
