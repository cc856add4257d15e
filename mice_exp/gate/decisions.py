"""What a gate answers about one call: its record and probability against the threshold tau (execute iff
p > tau, MICE Eq. 2), as a :class:`~mice_exp.gate.chat.Decision` (the Python API and the server) or as a JSON
answer (``mice-exp gate``'s batch command).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mice_exp.gate.chat import Call, Decision
from mice_exp.llm.toolcall import CallFormat
from mice_exp.tracking.schema import PRODUCT


def argument_rule(spec: Mapping[str, Any]) -> str:
    """The per-argument confidence a saved gate (``gate.json``) reports and asks the user about: the rule it chose
    on its training calls, ``product`` for gates saved before they chose one."""
    return spec.get("arguments", {}).get("rule", PRODUCT)


def decision(record: Mapping[str, Any], p: float, tau: float, tools: Sequence[str], fmt: CallFormat,
             rule: str) -> Decision:
    """The decision on a record in the reply format ``fmt``, its arguments' confidences under ``rule``; a call to
    a tool the request did not offer (the prompt also shows the demonstrations' tools) is no call: nothing the
    caller could run."""
    from mice_exp.features.arguments import answer_arguments  # loads sklearn

    call, why = None, record["parse_error"]
    if record["pred_args"] is not None:
        if record["pred_api"] in tools:
            span = fmt.spans(record["text"]).args
            call = Call(record["pred_api"], record["pred_args"],
                        None if span is None else record["text"][span[0]:span[1]])
        else:
            why = (f"the reply calls {record['pred_api']!r}, which is not among the tools offered "
                   f"({', '.join(tools)})")
    return Decision(call=call, probability=p, arguments=answer_arguments(record, fmt, rule)[0] if call else {},
                    execute=call is not None and p > tau, tau=tau, text=record["text"], parse_error=why,
                    prompt_tokens=int(record["prompt_tokens"]), completion_tokens=len(record["token_ids"]))


def denied(problem: str, reply: str, tau: float, prompt_tokens: int) -> Decision:
    """A proposed call that cannot be executed as it stands (:func:`~mice_exp.gate.chat.call_problem`: a tool not
    offered, arguments that are not JSON or that its schema does not admit): denied before scoring, so it carries
    no probability of being right (a number there would be read as one)."""
    return Decision(call=None, probability=None, arguments={}, execute=False, tau=tau, text=reply, parse_error=problem,
                    prompt_tokens=prompt_tokens, completion_tokens=0)


def answer(qid: Any, record: Mapping[str, Any], p: float, tau: float, fmt: CallFormat, rule: str) -> dict[str, Any]:
    """A query's JSON answer (:meth:`mice_exp.gate.Gate.decide` says what each key holds)."""
    from mice_exp.features.arguments import answer_arguments  # loads sklearn

    arguments, why_none = answer_arguments(record, fmt, rule)
    return {"id": qid, "call": {"api": record["pred_api"], "args": record["pred_args"]}, "text": record["text"],
            "probability": p, "decision": "execute" if p > tau else "abstain", "tau": tau,
            "raw_confidence": record["raw_confidence"], "arguments": arguments, "arguments_error": why_none,
            "parse_error": record["parse_error"], "error": None}


def failed(qid: Any, message: str, tau: float) -> dict[str, Any]:
    """The JSON answer of a query that could not be run: ``error`` says why, and there is no decision."""
    return {"id": qid, "call": None, "text": None, "probability": None, "decision": None, "tau": tau,
            "raw_confidence": None, "arguments": None, "arguments_error": None, "parse_error": None,
            "error": message}
