"""`mice-exp serve`: the gate behind an OpenAI-compatible endpoint, tested with the official openai client
against the real server on 127.0.0.1 (one server per module, on the tiny_random gate of test_gate.py).

tiny_random's replies never hold a call, so over HTTP its answers take the no-call path; how a parsed call
comes back (executed above tau, held below it) is checked on the gate's own decision of a parsed record,
read back by the openai client's response type, and end to end on SmolLM2 in the slow test.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from openai.types.chat import ChatCompletion

from mice_exp.data.ste import SHARED_RELATIVE_PATH
from mice_exp.gate import Gate
from mice_exp.gate.serve import completion, open_server
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
    assert choice.message.content == view["text"] and not view["execute"]
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
        expected = "did you mean days = 3?" if action == "confirm" else "I did not call get_weather: "
        assert expected in message.content and "70% chance" in message.content


@pytest.mark.parametrize("request_, error, status, param, code", [
    ({"tools": openai.NOT_GIVEN}, openai.BadRequestError, 400, "tools", "missing_required_parameter"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": ["x"]}}}]},
     openai.BadRequestError, 400, "tools[0].function.parameters", "invalid_function_parameters"),
    ({"model": "gpt-4o"}, openai.NotFoundError, 404, "model", "model_not_found"),
    ({"messages": ask("weather " * 9000)}, openai.BadRequestError, 400, "messages", "context_length_exceeded"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r", "tool_call_id": "c"}]},
     openai.BadRequestError, 400, "messages[1].role", None),
    ({"n": 2}, openai.BadRequestError, 400, "n", "unsupported_value"),
    ({"extra_body": {"mice_exp": {"on_abstain": "shrug"}}}, openai.BadRequestError, 400, "mice_exp.on_abstain", None),
], ids=["no-tools", "invalid-schema", "other-model", "too-long", "not-a-user-turn", "n", "on_abstain"])
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
        with gate._lock:  # the LLM is busy: the first request takes the one slot and waits for it
            first = ThreadPoolExecutor(1).submit(create, client, busy)
            while busy.service._slots._value:  # noqa: SLF001 - until the first request holds the slot
                time.sleep(0.01)
            with pytest.raises(openai.RateLimitError) as info:
                create(client, busy)
            assert info.value.code == "rate_limit_exceeded"
        assert first.result().object == "chat.completion"
        assert create(client, busy).object == "chat.completion"
    finally:
        busy.shutdown()
        busy.server_close()


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
        assert held.choices[0].message.tool_calls is None and "Before I call add_date: did you mean" in \
            held.choices[0].message.content
        assert held.model_extra["mice_exp"]["call"] == executed.model_extra["mice_exp"]["call"]
    finally:
        server.shutdown()
        server.server_close()
