"""``llm.backend=openai`` against servers that are not what they claim: each is one line naming what was wrong and
what was expected, before the stage where the endpoint check can tell (a models list and one tiny request), and
never fewer calls than asked. Real HTTP servers on 127.0.0.1 (the standard library's), asked through the openai
client as a run asks them: nothing of the client is mocked."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from mice_exp.pipeline import Pipeline
from mice_exp.errors import UserError
from tests.conftest import cache_sharing_models, stage_of
from tests.test_llm_stage import paths_in, tiny_cfg

SERVED = "tiny"
GENERATED = [785, 28, 2]  # three token ids a completion answers with, whatever the prompt


def completion(body: dict[str, Any], model: str = SERVED, echo: bool = True) -> dict[str, Any]:
    """What an OpenAI-compatible server answers to a token-id ``/v1/completions`` request, one choice per prompt and
    sample, tokens named by id (vLLM's ``return_tokens_as_token_ids``)."""
    prompts, n = body["prompt"], int(body.get("n") or 1)
    choices = []
    for i, prompt in enumerate(prompts):
        for j in range(n):
            ids = (list(prompt) if body.get("echo") and echo else []) + GENERATED[:body["max_tokens"]]
            choices.append({"index": i * n + j, "text": "", "finish_reason": "length",
                            "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids),
                                         "text_offset": [0] * len(ids), "top_logprobs": None}})
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": model, "choices": choices,
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


#: How each server answers ``/v1/completions`` (content type, body), from the request's JSON.
ANSWERS = {
    "good": lambda body: ("application/json", completion(body)),
    "html": lambda body: ("text/html", "<html><body>Welcome to nginx!</body></html>"),
    "no choices": lambda body: ("application/json", {"id": "x", "object": "text_completion", "model": SERVED}),
    "other model": lambda body: ("application/json", completion(body, model="llama-70b")),
    "fewer choices": lambda body: ("application/json", {**completion(body),
                                                        "choices": completion(body)["choices"][:1]}),
    "no echo": lambda body: ("application/json", completion(body, echo=False)),
}


def serve(kind: str) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def answer(self, content_type: str, payload: Any) -> None:
            data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if kind == "html":
                self.answer(*ANSWERS["html"]({}))
            else:
                self.answer("application/json", {"object": "list", "data": [{"id": SERVED, "object": "model"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.answer(*ANSWERS[kind](body))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def server(request) -> Iterator[str]:
    yield from serve(request.param)


def endpoint_cfg(url: str, **extra: str) -> dict:
    return tiny_cfg(**{"llm.backend": "openai", "llm.base_url": url, "llm.model": SERVED, "features": "conf_only",
                       "llm.max_retries": "0", **extra})


def records(cfg: dict, tmp_path) -> list[dict]:
    return stage_of(cfg, paths_in(cache_sharing_models(tmp_path))).output().records


@pytest.mark.parametrize("server", ["good"], indirect=True)
def test_a_server_that_answers_as_one_gives_every_call(server, tmp_path):
    calls = records(endpoint_cfg(server), tmp_path)
    assert len(calls) == 6 and all(r["token_ids"] and r["layer_strings"] == [] for r in calls)


@pytest.mark.parametrize("server,says", [
    ("html", r"the server at http://127.0.0.1:\d+/v1 answered /v1/models with text/html, not JSON; expected an "
             r"OpenAI-compatible API"),
    ("no choices", r"the server at .* answered a completion without 'choices'; expected an OpenAI-compatible "
                   r"/v1/completions"),
    ("other model", r"the server at .* answered as model 'llama-70b', not llm.model='tiny'"),
], indirect=["server"])
def test_a_server_that_is_not_one_is_refused_before_the_stage(server, says, tmp_path):
    stage = stage_of(endpoint_cfg(server), paths_in(cache_sharing_models(tmp_path)))
    with pytest.raises(UserError, match=says):
        stage.backend.generator()  # the check, before any batch
    assert not list((tmp_path / "llm").glob("*/shard-*"))


@pytest.mark.parametrize("server", ["fewer choices"], indirect=True)
def test_fewer_choices_than_prompts_is_one_line_not_fewer_calls(server, tmp_path):
    with pytest.raises(UserError, match=r"the server at .* returned 1 choices for 2 prompts; expected one per prompt "
                                        r"\(n=1 each\)"):
        records(endpoint_cfg(server), tmp_path)


@pytest.mark.parametrize("server", ["no echo"], indirect=True)
def test_p_true_against_a_server_that_ignores_echo_is_one_line(server, tmp_path):
    from mice_exp.pipeline import Pipeline

    pipeline = Pipeline.from_config(endpoint_cfg(server, **{"sources.use": "[p_true]"}),
                                    paths_in(cache_sharing_models(tmp_path)))
    output = pipeline.stage_output()  # the calls themselves come back
    with pytest.raises(UserError, match=r"the server at .* ignored echo=true \(log-probabilities of \d+ tokens, not of "
                                        r"the \d+-token prompt\); P\(True\) needs them; expected a server that echoes "
                                        r"prompts with logprobs \(vllm serve\) or sources.use without p_true"):
        pipeline.confidence_sources(output)


@pytest.mark.parametrize("setting,says", [
    ({"llm.max_retries": "-1"}, "llm.max_retries=-1; expected a non-negative integer"),
    ({"llm.timeout_s": "0"}, "llm.timeout_s=0; expected a number of seconds > 0"),
    ({"llm.timeout_s": "soon"}, "llm.timeout_s='soon'; expected a number of seconds > 0"),
])
def test_the_clients_settings_are_checked_before_anything_loads(setting, says):
    with pytest.raises(UserError, match=says):
        Pipeline.from_config(endpoint_cfg("http://127.0.0.1:9/v1", **setting))
