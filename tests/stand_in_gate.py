"""A stand-in for ``mice-exp serve``'s ``POST /v1/tool_calls/check`` on 127.0.0.1 (standard library only), for
what a guard does when the gate misbehaves and for what the guard itself costs: it answers every call with one
fixed verdict (or one per tool, or one per call: a function of the call), after ``delay`` seconds, or answers
``body`` instead (what a wrong URL answers: a web page, some other JSON). Every request body is kept in ``requests``.

``unavailable`` is each way a gate gives no verdict: nothing listening, slower than the guard's timeout, or
something else answering.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest

#: Where nothing listens (the discard port): a guard's connection is refused at once.
NOTHING = "http://127.0.0.1:9"
#: The timeout of the guards that meet a slow stand-in (which waits ``SLOW`` seconds, or until it is closed).
TIMEOUT, SLOW = 1.0, 30.0


class StandInGate(ThreadingHTTPServer):
    daemon_threads, block_on_close = True, False

    def __init__(self, decision: str | dict[str, str] | Callable[[dict[str, Any]], str] = "allow",
                 probability: float = 0.9, tau: float = 0.5, delay: float = 0.0, body: bytes | None = None,
                 kind: str = "application/json") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.decision, self.probability, self.tau, self.delay = decision, probability, tau, delay
        self.body, self.kind = body, kind
        self.requests: list[dict[str, Any]] = []
        self.closing = threading.Event()  # a delayed answer stops waiting when the server closes
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"

    def answer(self, request: dict[str, Any]) -> bytes:
        if self.body is not None:
            return self.body
        results = []
        for i, call in enumerate(request["tool_calls"]):
            name = call["function"]["name"]
            decision = (self.decision if isinstance(self.decision, str) else self.decision(call)
                        if callable(self.decision) else self.decision[name])
            reason = f"p = {self.probability} is at or below the low-risk tau 0.1" if decision == "deny" else None
            results.append({"index": i, "id": call.get("id"), "name": name, "decision": decision,
                            "probability": self.probability, "tau": self.tau, "risk": "gate", "arguments": {},
                            "reason": reason})
        return json.dumps({"object": "tool_calls.check", "model": "stand-in", "results": results}).encode()

    def __enter__(self) -> StandInGate:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: StandInGate

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(request)
        if self.server.closing.wait(self.server.delay):
            return
        body = self.server.answer(request)
        self.send_response(200)
        self.send_header("Content-Type", self.server.kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(params=["down", "slow", "garbage"])
def unavailable(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a gate that gives no verdict: nothing listening, one slower than ``TIMEOUT``, a web page."""
    if request.param == "down":
        yield NOTHING
        return
    kind = {"slow": {"delay": SLOW}, "garbage": {"body": b"<html><body>hello</body></html>", "kind": "text/html"}}
    with StandInGate(**kind[request.param]) as stand_in:
        yield stand_in.url
