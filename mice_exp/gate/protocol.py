"""OpenAI's Chat Completions protocol as the gate speaks it: requests checked, decisions as responses.

A request's every parameter is honoured or refused in one line (:data:`PARAMETERS`, :func:`chat_request`);
a decision becomes OpenAI's ``chat.completion`` object (:func:`completion`) or its ``chat.completion.chunk``
events (:func:`chunks`), with the gate's whole view in a top-level ``mice_exp`` field (:func:`extension`)
and its decision in each tool call's ``id`` (:func:`call_id`); refusals carry OpenAI's error body
(:func:`error_body`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from mice_exp.gate.chat import Decision, InvalidRequest, chat_example, check_tau, check_tools
from mice_exp.gate.policy import check_on_abstain, held_message

MAX_DEPTH = 64  # JSON nesting a request may have (OpenAI's own bodies need about 10)
#: Parameters that identify the caller for its own bookkeeping; they change nothing the gate does.
BOOKKEEPING = ("user", "metadata", "safety_identifier", "prompt_cache_key")
#: Sampling parameters accepted at the values that ask for what the gate does: greedy decoding (its calibration
#: is of the greedy call), its own stopping rule, no log-probabilities, no stored completion.
GREEDY: dict[str, tuple[Any, ...]] = {
    "temperature": (0,), "top_p": (1,), "presence_penalty": (0,), "frequency_penalty": (0,), "logprobs": (False,),
    "top_logprobs": (0,), "stop": ([],), "logit_bias": ({},), "store": (False,), "service_tier": ("auto", "default"),
    "response_format": ({"type": "text"},)}
#: Every parameter the chat endpoint reads (the rest are refused as OpenAI refuses an unknown one).
PARAMETERS = ("model", "messages", "tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options", "n",
              "seed", "max_tokens", "max_completion_tokens", "mice_exp", *BOOKKEEPING, *GREEDY)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def call_id(action: str, probability: float) -> str:
    """A tool call's id carrying the gate's decision (``call_execute_p8123_<hex>``: executed at p = 0.8123)."""
    return f"call_{action}_p{round(probability * 10_000):04d}_{uuid.uuid4().hex[:12]}"


def extension(decision: Decision, action: str) -> dict[str, Any]:
    """The ``mice_exp`` field: the gate's decision and confidences, whatever the message says.

    ``action``: what the server did, ``execute`` (the call is in ``tool_calls``), ``confirm`` / ``refuse``
    (held: the message asks or refuses), ``pass`` (below tau but returned), ``approved`` (a held call the user
    approved, returned) or ``no_call`` (no call to an offered tool); ``execute``: the gate's decision
    (``probability > tau`` and a call); ``call``: the parsed call, also when held.
    """
    call = None if decision.call is None else {"name": decision.call.name, "arguments": decision.call.arguments}
    return {"action": action, "execute": decision.execute, "probability": decision.probability, "tau": decision.tau,
            "call": call, "arguments": decision.arguments, "least_certain": decision.least_certain,
            "parse_error": decision.parse_error, "text": decision.text}


def reply_text(decision: Decision) -> str:
    """The content of a reply without a call: the model's text (after ReAct's "Final Answer:"), or, where it
    called a tool the request did not offer, a sentence that names none."""
    if decision.parse_error and decision.parse_error.startswith("the reply calls "):
        return "None of the tools offered fits this request."
    text = decision.text.strip()
    marker = text.rfind("Final Answer:")
    return text[marker + len("Final Answer:"):].strip() if marker >= 0 else text


def completion(decision: Decision, model: str, on_abstain: str, approved: bool = False) -> dict[str, Any]:
    """OpenAI's ``chat.completion`` object for a decision, with the ``mice_exp`` extension."""
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
    if decision.call is None:
        action, message["content"] = "no_call", reply_text(decision)
    elif decision.execute or on_abstain == "pass":
        action = "approved" if approved else "execute" if decision.execute else "pass"
        message["tool_calls"] = [{"id": call_id(action, decision.probability), "type": "function", "function": {
            "name": decision.call.name, "arguments": decision.call.arguments_json}}]
    else:
        action, message["content"] = on_abstain, held_message(decision, on_abstain)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}],
            "usage": {"prompt_tokens": decision.prompt_tokens, "completion_tokens": decision.completion_tokens,
                      "total_tokens": decision.prompt_tokens + decision.completion_tokens},
            "mice_exp": extension(decision, action)}


def chunks(response: Mapping[str, Any], include_usage: bool) -> Iterator[str]:
    """A decided completion as OpenAI's server-sent ``chat.completion.chunk`` events: the role, the content or
    the tool call, then the finish reason with the ``mice_exp`` view, the usage if asked, and ``[DONE]``."""
    head = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"], "system_fingerprint": None}
    (choice,) = response["choices"]
    message = choice["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message["content"]:
        deltas.append({"content": message["content"]})
    deltas += [{"tool_calls": [{"index": i} | call]} for i, call in enumerate(message.get("tool_calls") or [])]
    events = [head | {"choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}]} for d in deltas]
    events.append(head | {"choices": [{"index": 0, "delta": {}, "logprobs": None,
                                       "finish_reason": choice["finish_reason"]}], "mice_exp": response["mice_exp"]})
    if include_usage:
        events.append(head | {"choices": [], "usage": response["usage"]})
    for event in events:
        yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"


def _depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (iterative: a deep value must not exhaust the stack here either)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack += [(v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


def parse_body(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object, refused in one line when it is not one (or nests absurdly deep)."""
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidRequest(f"We could not parse the JSON body of your request ({error}); expected a JSON object "
                             "with model, messages and tools") from None
    except RecursionError:
        raise InvalidRequest("We could not parse the JSON body of your request: it nests deeper than the JSON "
                             f"reader allows; expected a JSON object nested at most {MAX_DEPTH} levels") from None
    if not isinstance(request, dict):
        raise InvalidRequest("the request body must be a JSON object with model, messages and tools")
    depth = _depth(request)
    if depth > MAX_DEPTH:
        raise InvalidRequest(f"the request body nests {depth} levels deep; expected at most {MAX_DEPTH}")
    return request


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat request: what the gate is asked, and how the answer is sent."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]  # the tools the prompt offers (one, under a named tool_choice)
    tau: float | None
    on_abstain: str
    required: bool  # tool_choice required or named: a reply without a call is an error
    stream: bool
    include_usage: bool


def chat_request(request: Mapping[str, Any], *, model: str, on_abstain: str, schemas: bool,
                 max_new_tokens: int) -> ChatRequest:
    """The request's parameters checked in OpenAI's order, each honoured or refused (:data:`PARAMETERS`), for a
    gate served as ``model`` that abstains as ``on_abstain`` unless asked otherwise, offers tools as schemas or
    not (``schemas``) and generates at most ``max_new_tokens``."""
    check_model(request, model, required=True)
    unknown = [k for k in request if k not in PARAMETERS]
    if unknown:
        raise InvalidRequest(f"Unrecognized request argument supplied: {unknown[0]}; this server reads "
                             f"{', '.join(PARAMETERS)}", param=unknown[0], code="unknown_parameter")
    for name, accepted in GREEDY.items():
        value = request.get(name)
        if value is not None and not any(value == a and type(value) in (type(a), float) for a in accepted):
            raise InvalidRequest(f"{name}={json.dumps(value)[:40]}: the gate decodes greedily with its own "
                                 f"stopping rule (its calibration is of that call); expected {name} "
                                 f"{' or '.join(json.dumps(a) for a in accepted)} or none",
                                 param=name, code="unsupported_value")
    for name in ("max_tokens", "max_completion_tokens"):
        value = request.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < max_new_tokens):
            raise InvalidRequest(f"{name}={value!r}: the gate's calls are generated to at most {max_new_tokens} "
                                 f"tokens, as it was calibrated; expected {name} >= {max_new_tokens} or none",
                                 param=name, code="unsupported_value")
    if request.get("seed") is not None and (isinstance(request["seed"], bool) or not isinstance(request["seed"], int)):
        raise InvalidRequest(f"seed={request['seed']!r}; expected an integer (the gate is greedy: any seed gives "
                             "the same answer)", param="seed")
    if request.get("n") not in (None, 1):
        raise InvalidRequest(f"n={request['n']!r}: the gate answers with one greedy call; expected n=1",
                             param="n", code="unsupported_value")
    if request.get("parallel_tool_calls") not in (None, True, False):
        raise InvalidRequest(f"parallel_tool_calls={request['parallel_tool_calls']!r}; expected true or false",
                             param="parallel_tool_calls")
    stream = request.get("stream")
    if stream not in (None, True, False):
        raise InvalidRequest(f"stream={stream!r}; expected true or false", param="stream")
    usage = _stream_options(request.get("stream_options"), bool(stream))
    tools, required = _tool_choice(request.get("tool_choice"), request.get("tools"))
    options = gate_options(request)
    chat_example(request.get("messages"), tools, 0, schemas)  # a bad request is refused here, not in a batch
    return ChatRequest(messages=request["messages"], tools=tools, tau=options.get("tau"),
                       on_abstain=check_on_abstain(options.get("on_abstain", on_abstain), "mice_exp.on_abstain"),
                       required=required, stream=bool(stream), include_usage=usage)


def check_model(request: Mapping[str, Any], model: str, required: bool) -> None:
    """``model``: the one served (a 404 for another), required or not."""
    if "model" not in request:
        if required:
            raise InvalidRequest("Missing required parameter: 'model'", param="model",
                                 code="missing_required_parameter")
        return
    if request["model"] != model:
        raise InvalidRequest(f"The model {str(request['model'])[:80]!r} does not exist: this server serves "
                             f"{model!r} (GET /v1/models)", param="model", code="model_not_found", status=404)


def _stream_options(options: Any, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise InvalidRequest("stream_options is only allowed with stream=true", param="stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"} or \
            options.get("include_usage") not in (None, True, False):
        raise InvalidRequest(f"stream_options={json.dumps(options)[:60]}; expected {{\"include_usage\": true or "
                             "false}", param="stream_options")
    return bool(options.get("include_usage"))


def _tool_choice(choice: Any, tools: Any) -> tuple[Any, bool]:
    """The tools the prompt offers and whether a call is required, as ``tool_choice`` says."""
    if choice in (None, "auto"):
        return tools, False
    if choice == "required":
        return tools, True
    if choice == "none":
        raise InvalidRequest("tool_choice='none': the gate decides on tool calls and has no reply without tools "
                             "to give; expected auto, required or a function", param="tool_choice",
                             code="unsupported_value")
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and choice.get("type") == "function" \
        and isinstance(choice.get("function"), dict) else None
    if not isinstance(name, str):
        raise InvalidRequest(f"tool_choice={json.dumps(choice)[:80]}; expected auto, required or "
                             '{"type": "function", "function": {"name": ...}}', param="tool_choice")
    named = [t for t in check_tools(tools) if t["function"]["name"] == name]
    if not named:
        raise InvalidRequest(f"tool_choice names {name!r}, which is not among the tools offered; expected one of "
                             f"{', '.join(t['function']['name'] for t in check_tools(tools))}",
                             param="tool_choice", code="invalid_value")
    return [t for t in tools if t["function"]["name"] == name], True


def gate_options(request: Mapping[str, Any]) -> dict[str, Any]:
    """The request's own ``mice_exp`` options: a ``tau`` and an ``on_abstain`` of its own."""
    options = request.get("mice_exp") or {}
    if not isinstance(options, dict) or set(options) - {"tau", "on_abstain"}:
        raise InvalidRequest("'mice_exp' must be an object such as {\"tau\": 0.8, \"on_abstain\": \"confirm\"}",
                             param="mice_exp")
    return options | ({"tau": check_tau(options["tau"])} if options.get("tau") is not None else {})
