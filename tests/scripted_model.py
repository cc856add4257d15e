"""An agent's model for deterministic host tests: a real OpenAI-compatible chat server on 127.0.0.1 (standard
library only) that replies from a script instead of a model.

Step ``i`` of the script answers a request whose conversation holds ``i`` tool results: ``("call", name,
arguments)`` proposes that call (``arguments`` a dict, sent as ``json.dumps`` writes it, or the argument text to
send as it is: a layout of the model's own), ``("answer", text)`` ends the agent's loop. A dict of scripts picks one by the
first tool the request offers (one server for several agents). Every request body is kept in
``requests``, so a test can check what the framework sent (the tool results fed back, the tools offered).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Step = tuple[str, ...] | tuple[str, str, dict[str, Any] | str]


class ScriptedModel(ThreadingHTTPServer):
    def __init__(self, script: list[Step] | dict[str, list[Step]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script, self.requests = script, []
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"

    def reply(self, request: dict[str, Any]) -> dict[str, Any]:
        script = self.script if isinstance(self.script, list) else self.script[request["tools"][0]["function"]["name"]]
        step = script[sum(m.get("role") == "tool" for m in request["messages"])]
        if step[0] == "answer":
            message, finish = {"role": "assistant", "content": step[1]}, "stop"
        else:
            call = {"id": f"call_{len(self.requests)}", "type": "function",
                    "function": {"name": step[1], "arguments": step[2] if isinstance(step[2], str) else json.dumps(step[2])}}
            message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        return {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0,
                "model": request.get("model", "scripted"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    def __enter__(self) -> ScriptedModel:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedModel

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        if not self.path.endswith("/chat/completions"):
            return self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(request)
        self._send(200, self.server.reply(request))

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass
