"""`mice-exp serve`: the gate behind an OpenAI-compatible endpoint, tested with the official openai client
against the real server on 127.0.0.1 (one server per module, on the tiny_random gate of test_gate.py).

tiny_random's replies never hold a call, so over HTTP its answers take the no-call path; how a parsed call
comes back (executed above tau, held below it) is checked on the gate's own decision of a parsed record,
read back by the openai client's response type, and end to end on SmolLM2 in the slow test.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletion

from mice_exp.data.ste import SHARED_RELATIVE_PATH
from mice_exp.gate import Gate
from mice_exp.gate.app import open_server
from mice_exp.gate.protocol import completion
from mice_exp.gate.service import Batcher
from mice_exp.paths import PACKAGE_ROOT
from tests.test_gate import PARSED, WEATHER, ask, copy_gate, fitted  # noqa: F401 - fitted: the module's gate

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def gate(fitted, tiny_llm):  # noqa: F811 - the fixture imported above
    return Gate.load(fitted[0], llm=tiny_llm)


def serving(gate: Gate, **options):
    """A server in a thread; stop it with ``.shutdown()``."""
    server = open_server(gate, quiet=True, **options)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def server(gate):
    server = serving(gate)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)


def create(client, server, **request):
    return client.chat.completions.create(**({"model": server.service.model, "messages": ask("Weather in Paris?"),
                                              "tools": [WEATHER]} | request))


def test_it_listens_on_loopback_and_lists_the_gates_model(server, client):
    assert server.server_address[0] == "127.0.0.1" and server.url.startswith("http://127.0.0.1:")
    assert [m.id for m in client.models.list()] == ["mice_exp-gate-tiny_random-cosine-mice_lr"]
    assert client.models.retrieve(server.service.model).owned_by == "mice_exp"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_an_answer_is_a_chat_completion_with_the_gates_view(server, client):
    response = create(client, server)
    assert response.object == "chat.completion" and response.model == server.service.model
    assert response.usage.prompt_tokens > 100 and response.usage.completion_tokens == 6
    (choice,) = response.choices
    view = response.model_extra["mice_exp"]
    assert set(view) == {"action", "execute", "probability", "tau", "call", "arguments", "least_certain",
                         "parse_error", "text"}
    assert 0.0 <= view["probability"] <= 1.0 and view["tau"] == 0.5
    # tiny_random's reply holds no call: a 200 with its text as the content, as OpenAI answers a text reply
    assert view["action"] == "no_call" and view["call"] is None and view["parse_error"] == "no 'Action:' line"
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == view["text"].strip() and not view["execute"]  # the text, without its blank lines
    held = create(client, server, extra_body={"mice_exp": {"tau": 1.0, "on_abstain": "refuse"}}).model_extra["mice_exp"]
    assert held["tau"] == 1.0 and held["probability"] == pytest.approx(view["probability"])


@pytest.mark.parametrize("tau, on_abstain, action", [(0.0, "confirm", "execute"), (1.0, "confirm", "confirm"),
                                                     (1.0, "refuse", "refuse"), (1.0, "pass", "pass")])
def test_a_parsed_call_is_executed_above_tau_and_held_below_it(gate, tau, on_abstain, action):
    decision = gate._decision(PARSED, 0.7, tau, ["get_weather"])
    response = ChatCompletion.model_validate(completion(decision, "m", on_abstain))  # as the openai client reads it
    message, view = response.choices[0].message, response.model_extra["mice_exp"]
    assert view["action"] == action and view["execute"] == (tau == 0.0)
    assert view["call"] == {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}  # also when held
    assert view["arguments"] == {"city": 0.5, "days": 0.25} and view["least_certain"] == "days"
    if action in ("execute", "pass"):
        (call,) = message.tool_calls
        assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
        assert response.choices[0].finish_reason == "tool_calls" and message.content is None
    else:
        assert message.tool_calls is None and response.choices[0].finish_reason == "stop"
        expected = "did you mean days = 3?" if action == "confirm" else 'I did not call get_weather({"city": "Paris", "days": 3}): '
        assert expected in message.content and "70% chance" in message.content


@pytest.mark.parametrize("request_, error, status, param, code", [
    ({"tools": openai.NOT_GIVEN}, openai.BadRequestError, 400, "tools", "missing_required_parameter"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": ["x"]}}}]},
     openai.BadRequestError, 400, "tools[0].function.parameters", "invalid_function_parameters"),
    ({"model": "gpt-4o"}, openai.NotFoundError, 404, "model", "model_not_found"),
    ({"messages": ask("weather " * 9000)}, openai.BadRequestError, 400, "messages", "context_length_exceeded"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r", "tool_call_id": "c"}]},
     openai.BadRequestError, 400, "messages[1].tool_call_id", None),
    ({"messages": ask("Weather?") + [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}, {"role": "tool", "tool_call_id": "c",
                                                                      "content": "sunny " * 17_000}]},
     openai.BadRequestError, 400, "messages", "context_length_exceeded"),
    ({"n": 2}, openai.BadRequestError, 400, "n", "unsupported_value"),
    ({"extra_body": {"mice_exp": {"on_abstain": "shrug"}}}, openai.BadRequestError, 400, "mice_exp.on_abstain", None),
], ids=["no-tools", "invalid-schema", "other-model", "too-long", "answers-no-call", "100-KB-tool-result", "n", "on_abstain"])
def test_a_bad_request_gets_openais_status_and_error_body(server, client, request_, error, status, param, code):
    with pytest.raises(error) as info:
        create(client, server, **request_)
    assert info.value.status_code == status and info.value.param == param and info.value.code == code
    assert info.value.type == "invalid_request_error" and "\n" not in info.value.body["message"]


def post(url: str, data: bytes) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, {"Content-Type": "application/json"}), timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as failed:
        return failed.code, json.loads(failed.read())


def test_malformed_json_and_unknown_paths_get_error_bodies_and_the_server_goes_on(server, client):
    status, body = post(f"{server.url}/chat/completions", b'{"model": "m", "messages": [')
    assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"].startswith("We could not parse the JSON body of your request")
    status, body = post(f"{server.url}/completions", b"{}")
    assert status == 404 and body["error"]["message"].startswith("Invalid URL (POST /v1/completions)")
    connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=60)
    connection.putrequest("POST", "/v1/chat/completions")
    connection.putheader("Content-Length", str(2**30))  # announced, never sent
    connection.endheaders()
    answer = connection.getresponse()
    assert answer.status == 413 and "at most" in json.loads(answer.read())["error"]["message"]
    connection.close()
    assert create(client, server).object == "chat.completion"  # still serving


def test_twenty_concurrent_requests_all_answer(server, client):
    start = time.perf_counter()
    create(client, server)
    one = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(lambda i: create(client, server, messages=ask(f"Weather in city {i}?")), range(20)))
    took = time.perf_counter() - start
    assert [r.object for r in responses] == ["chat.completion"] * 20
    assert len({r.id for r in responses}) == 20
    assert took < 20 * one * 3 + 10, f"20 requests took {took:.1f} s; one alone {one:.1f} s"  # served one after another


def test_a_full_queue_answers_429_and_the_next_request_is_served(gate):
    busy = serving(gate, max_queue=1)
    client = openai.OpenAI(base_url=busy.url, api_key="x", max_retries=0, timeout=120)
    try:
        with gate._lock:  # the LLM is busy: the first request takes the one place in the queue and waits for it
            first = ThreadPoolExecutor(1).submit(create, client, busy)
            while not busy.service.pending:  # until the first request holds its place
                time.sleep(0.01)
            with pytest.raises(openai.RateLimitError) as info:
                create(client, busy)
            assert info.value.code == "rate_limit_exceeded"
        assert first.result().object == "chat.completion"
        assert create(client, busy).object == "chat.completion"
    finally:
        busy.shutdown()
        busy.server_close()


def test_stream_true_decides_then_streams_openai_chunks_with_the_gates_view_last(server, client):
    stream = create(client, server, stream=True, stream_options={"include_usage": True})
    events = list(stream)
    assert {e.object for e in events} == {"chat.completion.chunk"} and len({e.id for e in events}) == 1
    assert events[0].choices[0].delta.role == "assistant"
    finish = [e for e in events if e.choices and e.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "stop"
    view = finish[0].model_extra["mice_exp"]
    assert view["action"] == "no_call" and 0.0 <= view["probability"] <= 1.0
    assert events[-1].choices == [] and events[-1].usage.completion_tokens == 6  # include_usage: the last chunk
    text = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
    assert text == view["text"].strip()


def test_a_held_call_streams_as_text_and_a_passed_one_as_a_tool_call_delta(gate):
    from mice_exp.gate.protocol import chunks

    decision = gate._decision(PARSED, 0.7, 1.0, ["get_weather"])
    for on_abstain, kind in (("confirm", "content"), ("pass", "tool_calls")):
        events = [json.loads(e[6:]) for e in chunks(completion(decision, "m", on_abstain), False) if e != "data: [DONE]\n\n"]
        (delta,) = [e["choices"][0]["delta"] for e in events if kind in e["choices"][0]["delta"] and
                    e["choices"][0]["delta"][kind]]
        if kind == "tool_calls":
            (call,) = delta["tool_calls"]
            assert call["index"] == 0 and call["function"]["name"] == "get_weather" and call["id"].startswith("call_pass_p7000_")
        else:
            assert delta["content"].startswith('Before I call get_weather({"city": "Paris", "days": 3}): did you mean')


#: Each parameter at a value the gate honours: greedy decoding of at most its max_new_tokens (6 here), one call.
HONOURED = {"temperature": 0, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0, "logprobs": False,
            "top_logprobs": 0, "stop": [], "logit_bias": {}, "store": False, "service_tier": "auto",
            "response_format": {"type": "text"}, "seed": 7, "max_tokens": 6, "max_completion_tokens": 100, "n": 1,
            "parallel_tool_calls": False, "tool_choice": "auto", "user": "u1", "metadata": {"k": "v"},
            "safety_identifier": "s", "prompt_cache_key": "p", "stream": False}
REFUSED = {"temperature": 0.7, "top_p": 0.9, "presence_penalty": 0.5, "frequency_penalty": 1, "logprobs": True,
           "top_logprobs": 3, "stop": ["\n"], "logit_bias": {"50256": -100}, "store": True, "service_tier": "flex",
           "response_format": {"type": "json_object"}, "seed": "7", "max_tokens": 5, "max_completion_tokens": 2,
           "n": 2, "parallel_tool_calls": "yes", "tool_choice": "none", "stream": "yes",
           "stream_options": {"include_usage": True}, "functions": [{"name": "f"}], "reasoning_effort": "low"}


def test_every_parameter_at_a_value_the_gate_honours_is_accepted(server, client):
    response = create(client, server, **HONOURED)
    assert response.object == "chat.completion" and response.model_extra["mice_exp"]["action"] == "no_call"
    assert set(HONOURED) | {"model", "messages", "tools", "stream_options", "mice_exp"} == set(
        __import__("mice_exp.gate.protocol", fromlist=["PARAMETERS"]).PARAMETERS)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_parameter_the_gate_cannot_honour_is_refused_in_one_line_naming_it(server, client, name):
    with pytest.raises(openai.BadRequestError) as info:
        create(client, server, extra_body={name: REFUSED[name]})
    assert info.value.param == name and "\n" not in info.value.body["message"], info.value.body


def test_tool_choice_names_one_offered_function_or_requires_a_call(gate, server, client):
    from mice_exp.gate.service import ChatService

    service = ChatService(gate, "m")
    named = {"type": "function", "function": {"name": "add_date"}}
    request = service.chat_request({"model": "m", "messages": ask("When?"), "tools": [WEATHER, ADD_DATE],
                                    "tool_choice": named})
    assert request.tools == [ADD_DATE] and request.required  # the prompt offers the named function alone
    with pytest.raises(openai.BadRequestError, match="tool_choice names 'add_date', which is not among the tools"):
        create(client, server, tool_choice=named)
    with pytest.raises(openai.UnprocessableEntityError) as info:  # tiny_random replies without a call
        create(client, server, tool_choice="required")
    assert info.value.code == "tool_choice_unmet" and "replied without a call to get_weather" in info.value.message


def test_the_agents_sdk_and_langchain_talk_to_it_plain_and_streaming(server):
    """What the frameworks send (their tool schemas with Optional parameters, their parameters) is all read;
    tiny_random's reply holds no call, so each run ends with its text as the final answer."""
    import asyncio

    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from openai import AsyncOpenAI

    def forecast(city: str, days: int | None = None) -> str:
        """Forecast for a city."""
        return "sunny"

    set_tracing_disabled(True)

    def agent() -> Agent:
        model = OpenAIChatCompletionsModel(model=server.service.model,
                                           openai_client=AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0))
        return Agent(name="weather", instructions="Answer about the weather.", model=model,
                     tools=[function_tool(forecast)])

    async def streamed() -> str:
        run = Runner.run_streamed(agent(), "Weather in Paris?")
        kinds = {event.type async for event in run.stream_events()}
        assert "raw_response_event" in kinds
        return run.final_output

    assert Runner.run_sync(agent(), "Weather in Paris?").final_output == "" == asyncio.run(streamed())
    chat = ChatOpenAI(model=server.service.model, base_url=server.url, api_key="x", max_retries=0).bind_tools(
        [tool(forecast)])
    assert chat.invoke("Weather in Paris?").content == "" and {c.content for c in chat.stream("Weather?")} == {""}


def test_the_responses_api_is_a_404_naming_the_chat_completions_model(server, client):
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=server.service.model, input="Weather in Paris?")
    assert "OpenAIChatCompletionsModel" in info.value.message


def test_yes_after_a_held_call_returns_the_call_without_asking_the_llm(gate, server, client, monkeypatch):
    held = completion(gate._decision(PARSED, 0.42, 0.5, ["get_weather"]), "m", "confirm")["choices"][0]["message"]
    assert held["content"].startswith('Before I call get_weather({"city": "Paris", "days": 3}): did you mean days = 3?')
    monkeypatch.setattr(gate, "check_batch", lambda *a, **k: pytest.fail("the LLM was asked"))
    conversation = ask("Weather in Paris for 3 days?") + [held]
    response = create(client, server, messages=conversation + [{"role": "user", "content": "Yes, go ahead."}])
    (call,) = response.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert call.id.startswith("call_approved_p4200_") and response.model_extra["mice_exp"]["action"] == "approved"
    monkeypatch.undo()
    answer = create(client, server, messages=conversation + [{"role": "user", "content": "No, 5 days."}])
    assert answer.model_extra["mice_exp"]["action"] == "no_call"  # a correction goes to the gate with the whole chat


def test_a_reply_calling_a_tool_not_offered_names_no_tool(gate):
    response = completion(gate._decision(PARSED, 0.9, 0.5, ["add_date"]), "m", "confirm")
    message = response["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"] == "None of the tools offered fits this request."


def test_concurrent_requests_run_as_gate_batches(gate, monkeypatch):
    sizes = []
    check_batch = gate.check_batch
    monkeypatch.setattr(gate, "check_batch", lambda requests, **k: sizes.append(len(requests)) or check_batch(requests, **k))
    batched = serving(gate, batch_size=3)
    client = openai.OpenAI(base_url=batched.url, api_key="x", max_retries=0, timeout=300)
    pool = ThreadPoolExecutor(6)
    try:
        with gate._lock:  # all six wait for the LLM, then run three at a time
            futures = [pool.submit(create, client, batched, messages=ask(f"Weather in city {i}?")) for i in range(6)]
            while batched.service.pending < 6:
                time.sleep(0.01)
        assert [f.result().object for f in futures] == ["chat.completion"] * 6
        assert sum(sizes) == 6 and max(sizes) == 3 and len(sizes) <= 3, sizes
    finally:
        pool.shutdown()
        batched.shutdown()
        batched.server_close()


def raw(port: int, data: bytes, read: bool = True) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=120) as connection:
        connection.sendall(data)
        if not read:
            return b""
        reply = b""
        while b"\r\n0\r\n\r\n" not in reply and not reply.endswith(b"}"):
            chunk = connection.recv(65536)
            if not chunk:
                break
            reply += chunk
        return reply


def test_bad_bodies_chunked_requests_and_hang_ups_get_answers_not_tracebacks(server, client, capfd):
    status, body = post(f"{server.url}/chat/completions", b"[" * 100_000)  # RecursionError in the JSON reader
    assert status == 400 and "nests deeper than the JSON reader allows" in body["error"]["message"]
    deep = {"model": server.service.model, "messages": ask("q"), "tools": [WEATHER], "x": json.loads("[" * 500 + "]" * 500)}
    status, body = post(f"{server.url}/chat/completions", json.dumps(deep).encode())
    assert status == 400 and "nests 501 levels deep; expected at most 64" in body["error"]["message"]
    lone = json.dumps({"model": server.service.model, "messages": ask("bad \ud800 text"), "tools": [WEATHER]})
    status, body = post(f"{server.url}/chat/completions", lone.encode())  # JSON's "\ud800": no character
    assert status == 400 and body["error"]["param"] == "messages[1].content" and "lone UTF-16 surrogate" in \
        body["error"]["message"]
    request = json.dumps({"model": server.service.model, "messages": ask("Weather in Paris?"), "tools": [WEATHER]}).encode()
    half = len(request) // 2
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (request[:half], request[half:])) + b"0\r\n\r\n"
    reply = raw(server.server_port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                    b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked)
    assert reply.startswith(b"HTTP/1.1 200") and b'"object":"chat.completion"' in reply
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(request)}\r\n\r\n").encode()
    raw(server.server_port, head + request[:half], read=False)  # hangs up halfway through the body
    raw(server.server_port, head + request, read=False)  # hangs up while the gate works on it
    assert create(client, server).object == "chat.completion"  # still serving
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("argument, message", [("port=70000", "port='70000'; expected a TCP port from 0 to 65535"),
                                               ("batch_size=0", "batch_size='0'; expected a positive integer"),
                                               ("tool_taus=rm:2", "tool_taus: 'rm:2'; expected NAME:TAU pairs")])
def test_serve_refuses_bad_options_before_the_llm_loads(fitted, monkeypatch, capsys, argument, message):  # noqa: F811
    import sys

    from mice_exp.__main__ import main
    from mice_exp.gate import command

    monkeypatch.setattr(command, "load_gate", lambda *a: pytest.fail("the gate was loaded"))
    monkeypatch.setattr(sys, "argv", ["mice-exp", "serve", f"model={fitted[0]}", argument])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # not other servers' progress
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0]


def test_a_judged_calls_tau_comes_from_its_mcp_annotations_else_the_config_else_the_gate():
    from mice_exp.gate.policy import ToolRisk

    risk = ToolRisk(high=0.9, low=0.1, tools={"get_weather": 0.3})
    assert risk.tau(WEATHER | {"annotations": {"destructiveHint": True}}, 0.5) == (0.9, "destructiveHint")
    read_only = {"type": "function", "function": WEATHER["function"] | {"annotations": {"readOnlyHint": True}}}
    assert risk.tau(read_only, 0.5) == (0.1, "readOnlyHint")  # also inside "function", where MCP bridges put it
    assert risk.tau(WEATHER, 0.5) == (0.3, "config") and risk.tau(ADD_DATE, 0.5) == (0.5, "gate")


@pytest.mark.parametrize("p, tau, decision", [(0.7, 0.5, "allow"), (0.7, 0.9, "ask"), (0.05, 0.9, "deny")])
def test_a_judged_call_is_allowed_asked_about_or_denied(gate, p, tau, decision):
    from mice_exp.gate.policy import verdict

    result = verdict(gate._decision(PARSED, p, tau, ["get_weather"]), 0, "c1", "get_weather", tau, "gate", 0.1)
    assert result["decision"] == decision and result["probability"] == p and result["tau"] == tau
    assert result["arguments"] == {"city": 0.5, "days": 0.25}
    if decision == "ask":
        assert result["ask_about"] == "days" and "did you mean days = 3?" in result["question"]
    else:
        assert result["ask_about"] is None and result["question"] is None
    assert (result["reason"] is None) == (decision != "deny")
    elsewhere = verdict(gate._decision(PARSED, 0.99, 0.5, ["add_date"]), 1, None, "get_weather", 0.5, "gate", 0.1)
    assert elsewhere["decision"] == "deny" and "not among the tools offered" in elsewhere["reason"]


def test_check_judges_each_proposed_call_at_its_tools_risk(gate, server):
    url = f"{server.url}/tool_calls/check"
    destructive = WEATHER | {"annotations": {"destructiveHint": True}}
    calls = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
             {"id": "c2", "type": "function", "function": {"name": "send_mail", "arguments": "{}"}},
             {"id": "c3", "type": "function", "function": {"name": "get_weather", "arguments": '{"town": "Paris"}'}}]
    request = {"messages": ask("Weather in Paris?"), "tools": [destructive], "tool_calls": calls}
    status, body = post(url, json.dumps(request).encode())
    assert status == 200 and body["object"] == "tool_calls.check" and body["model"] == server.service.model
    first, unknown, misfit = body["results"]
    assert [r["id"] for r in body["results"]] == ["c1", "c2", "c3"]
    (alone,) = gate.score_batch([(request["messages"], [destructive], calls[0])])
    assert first["probability"] == pytest.approx(alone.probability, abs=1e-6)  # the gate's own scoring
    assert (first["tau"], first["risk"]) == (0.9, "destructiveHint") and set(first["arguments"]) == {"city"}
    assert first["decision"] == ("allow" if first["probability"] > 0.9 else "deny" if first["probability"] <= 0.1
                                 else "ask")
    assert unknown["decision"] == "deny" and "'send_mail', which is not among the tools offered" in unknown["reason"]
    assert misfit["decision"] == "deny" and "lacks the required argument 'city'" in misfit["reason"]
    status, body = post(url, json.dumps(request | {"mice_exp": {"tau": 0.0}}).encode())
    assert body["results"][0]["decision"] == "allow" and body["results"][0]["risk"] == "request"
    for bad, param in [({"tool_calls": [{"id": "c", "type": "function"}]}, "tool_calls[0].function"),
                       ({"tool_calls": []}, "tool_calls"), ({"messages": ask("q")[:1]}, "messages"),
                       ({"model": "gpt-4o"}, "model"), ({"stream": True}, "stream")]:
        status, body = post(url, json.dumps(request | bad).encode())
        assert 400 <= status < 500 and body["error"]["param"] == param, body


@pytest.mark.parametrize("broken", ["missing", "checksum"])
def test_serve_refuses_a_missing_or_untrusted_gate_in_one_line(fitted, tmp_path, monkeypatch, capsys, broken):  # noqa: F811
    import sys

    from mice_exp.__main__ import main

    folder = tmp_path / "nothing"
    if broken == "checksum":
        folder = copy_gate(fitted[0], tmp_path / "tampered")
        (folder / "estimator.skops").write_bytes((folder / "estimator.skops").read_bytes() + b"\0")
    monkeypatch.setattr(sys, "argv", ["mice-exp", "serve", f"model={folder}", "port=0"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("mice-exp: error: ")
    assert ("no such folder" if broken == "missing" else "does not match the checksum") in err[0]


ADD_DATE = {"type": "function", "function": {"name": "add_date", "description": "Add days to a date. Date should "
            "be pass as 'yyyy-mm-dd'..", "parameters": {"type": "object", "properties": {
                "date": {"type": "string"}, "days": {"type": "integer"}}, "required": ["date", "days"]}}}


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not (PACKAGE_ROOT / SHARED_RELATIVE_PATH).is_file(), reason="the shared STE data is not here")
def test_a_smollm2_gate_executes_its_call_at_tau_0_and_holds_it_at_tau_1(tmp_path):
    """End to end on a model that writes calls: SmolLM2's gate built from the published records (MICE LR on the
    raw confidence, fitted without the LLM), served, asked through the openai client (minutes on a CPU)."""
    from mice_exp.compose import as_plain, compose_config
    from mice_exp.run import run
    from tests.conftest import cache_sharing_models

    cache = cache_sharing_models(tmp_path / "cache")
    run(as_plain(compose_config(["llm=smollm2_135m", "llm.records=experiments/records/ste-smollm2_135m.jsonl.gz",
                                 "features=conf_only", "estimator=mice_lr", "tracking.enabled=false",
                                 f"paths.cache={cache}"])))
    (folder,) = (cache / "gates").iterdir()
    server = serving(Gate.load(folder, models=cache / "models"))
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=1200)
    question = [{"role": "user", "content": "What is the date 90 days from 2022-10-14?"}]
    try:
        executed = create(client, server, messages=question, tools=[ADD_DATE], extra_body={"mice_exp": {"tau": 0.0}})
        (call,) = executed.choices[0].message.tool_calls
        assert call.function.name == "add_date" and json.loads(call.function.arguments) == {"date": "2022-10-14",
                                                                                           "days": 90}
        held = create(client, server, messages=question, tools=[ADD_DATE], extra_body={"mice_exp": {"tau": 1.0}})
        assert held.choices[0].message.tool_calls is None
        assert held.choices[0].message.content.startswith(
            'Before I call add_date({"date": "2022-10-14", "days": 90}): did you mean')
        assert held.model_extra["mice_exp"]["call"] == executed.model_extra["mice_exp"]["call"]
    finally:
        server.shutdown()
        server.server_close()


def serve_process(gate: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """``mice-exp serve`` of ``gate`` (this Python, this checkout) as its own process on a free port, once its
    models list answers; its URL."""
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen([sys.executable, "-m", "mice_exp", "serve", f"model={gate}", "port=0", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said = []
    for line in proc.stderr:
        said.append(line)
        if "Ctrl-C stops" in line:
            url = line.split(" on ", 1)[1].split(" ", 1)[0]
            break
    else:
        raise AssertionError(f"serve exited with {proc.wait()} before serving: {''.join(said[-5:])}")
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/models", timeout=5).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"serve at {url} never answered")


def test_sigterm_stops_the_server_as_ctrl_c_does(fitted):  # noqa: F811
    """A scheduler's or container's stop ends serving through the process's exit handlers (what stops a vLLM
    engine's core process); under the default handler, which uvicorn re-raises SIGTERM to, it died by the signal."""
    proc, _ = serve_process(fitted[0])
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.strip().splitlines()[-1] == "serve: stopped"


def test_the_batcher_runs_its_idle_hook_on_the_llm_s_thread_once_the_queue_drains():
    """What mice-exp serve hands the heap's free pages back in (trim_heap): after the last waiting batch, on the
    one thread the LLM runs on, so never beside a batch."""
    threads, events = [], []

    def run(items: list[int]) -> list[int]:
        threads.append(threading.current_thread().name)
        events.append(("batch", tuple(items)))
        return [i * 10 for i in items]

    def idle() -> None:
        threads.append(threading.current_thread().name)
        events.append(("idle",))

    async def main() -> list[int]:
        batcher = Batcher(run, ThreadPoolExecutor(1, thread_name_prefix="llm"), max_queue=8, batch_size=2, idle=idle)
        loop = asyncio.create_task(batcher.serve())
        await asyncio.sleep(0)
        results = await asyncio.gather(*(batcher.submit(i) for i in range(3)))
        await asyncio.sleep(0.1)
        loop.cancel()
        return results

    assert asyncio.run(main()) == [0, 10, 20]
    assert events == [("batch", (0, 1)), ("batch", (2,)), ("idle",)]
    assert set(threads) == {"llm_0"}

