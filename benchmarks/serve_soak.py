"""Soak `mice-exp serve`: N requests from C concurrent clients on 127.0.0.1, good and malformed mixed.

Starts the server as its own process (as a user would), waits for its port, then sends ``--requests``
requests from ``--clients`` threads: every ``--good-every``-th a good chat request (a fresh query each, and
one in four a whole agent loop ending with a tool result), the others one malformed request each in
turn (bad JSON, 100,000-deep nesting, a lone surrogate, a tool message without a tool_call_id, an unknown
parameter, another model, a chunked body with a bad tool, a client that hangs up mid-body). Checks: every good
request gets a 200 ``chat.completion``, every bad one a 4xx with OpenAI's error body, the server answers at
the end and printed no traceback; prints the server's resident memory (VmRSS) after warm-up, its peak and
at the end.

    python benchmarks/serve_soak.py --model GATE_FOLDER [--requests 200 --clients 8 --good-every 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Forecast for a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def post(port: int, body: bytes, timeout: float = 1800) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as failed:
        return failed.code, json.loads(failed.read())


def raw(port: int, data: bytes, hang_up: bool = False) -> tuple[int, dict]:
    """A hand-written HTTP request (chunked bodies, hang-ups); the status and body it gets."""
    with socket.create_connection(("127.0.0.1", port), timeout=1800) as connection:
        connection.sendall(data)
        if hang_up:
            return 499, {}
        reply = b""
        while chunk := connection.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body.startswith(b"{") else {}


def good(model: str, i: int) -> bytes:
    messages = [{"role": "user", "content": f"What will the weather be in city number {i} for {i % 5 + 1} days?"}]
    if i % 4 == 0:  # an agent loop's second model call: the call made, its result, the next reply asked for
        call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(
            {"city": f"city number {i}", "days": i % 5 + 1})}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"forecast": "sunny", "high": 21})}]
    return json.dumps({"model": model, "messages": messages, "tools": [WEATHER]}).encode()


def bad(model: str, port: int, i: int) -> tuple[int, dict]:
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    body = {"model": model, "messages": ask, "tools": [WEATHER]}
    kind = i % 8
    if kind == 0:
        return post(port, b'{"model": "m", "messages": [')
    if kind == 1:
        return post(port, b"[" * 100_000)
    if kind == 2:
        return post(port, json.dumps(body | {"messages": [{"role": "user", "content": "bad \ud800"}]}).encode())
    if kind == 3:
        return post(port, json.dumps(body | {"messages": ask + [{"role": "tool", "content": "r"}]}).encode())
    if kind == 4:
        return post(port, json.dumps(body | {"temperature_x": 1}).encode())
    if kind == 5:
        return post(port, json.dumps(body | {"model": "gpt-4o"}).encode())
    data = json.dumps(body | {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "required": ["x"]}}}]}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if kind == 6:
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
        return raw(port, head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    return raw(port, head + f"Content-Length: {len(data)}\r\n\r\n".encode() + data[:40], hang_up=True)


def start_server(gate: str, serve_args: Sequence[str]) -> tuple[subprocess.Popen, int, str, Any]:
    """``mice-exp serve`` of ``gate`` as its own process on a free port of 127.0.0.1, once it answers: the
    process, its port, the model id it serves and its log file. Exits with the log's tail if it dies first."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    server = subprocess.Popen([sys.executable, "-m", "mice_exp", "serve", f"model={gate}", f"port={port}",
                               *serve_args], stdout=log, stderr=subprocess.STDOUT, text=True)
    start = time.perf_counter()
    while True:
        if server.poll() is not None:
            sys.exit(f"serve exited with {server.returncode}: {Path(log.name).read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as answer:
                model = json.loads(answer.read())["data"][0]["id"]
            break
        except OSError:
            time.sleep(1)
    print(f"serve up in {time.perf_counter() - start:.1f} s; load average {os.getloadavg()}", flush=True)
    return server, port, model, log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a gate folder or runs:/ URI")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--good-every", type=int, default=2, help="every k-th request is a good one")
    parser.add_argument("--serve-args", nargs="*", default=[], help="more key=value arguments of mice-exp serve")
    args = parser.parse_args()

    server, port, model, log = start_server(args.model, args.serve_args)
    try:
        status, _ = post(port, good(model, 1))
        warm = rss_mib(server.pid)
        print(f"warm-up request: {status}; VmRSS {warm:.0f} MiB", flush=True)
        peak = [warm]
        samples: list[tuple[int, float]] = []
        lock = threading.Lock()
        done = [0]

        def one(i: int) -> tuple[bool, int, dict]:
            is_good = i % args.good_every == 0
            status, body = post(port, good(model, i)) if is_good else bad(model, port, i // args.good_every)
            with lock:
                done[0] += 1
                memory = rss_mib(server.pid)
                peak[0] = max(peak[0], memory)
                if done[0] % 25 == 0:
                    samples.append((done[0], memory))
                    print(f"  {done[0]} requests, VmRSS {memory:.0f} MiB", flush=True)
            return is_good, status, body

        tick = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            results = list(pool.map(one, range(args.requests)))
        took = time.perf_counter() - tick
        good_ok = sum(g and s == 200 and b.get("object") == "chat.completion" for g, s, b in results)
        bad_ok = sum((not g) and (400 <= s < 500) and (s == 499 or set(b.get("error", {})) ==
                                                         {"message", "type", "param", "code"}) for g, s, b in results)
        n_good = sum(g for g, _, _ in results)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=60) as answer:
            alive = answer.status == 200
        end = rss_mib(server.pid)
        tracebacks = Path(log.name).read_text().count("Traceback")
        print(f"{args.requests} requests from {args.clients} clients in {took:.0f} s: good answered {good_ok} / "
              f"{n_good}, bad refused with a 4xx {bad_ok} / {args.requests - n_good}; server up at the end: {alive}; "
              f"tracebacks in its log: {tracebacks}; VmRSS after warm-up {warm:.0f} MiB, peak {peak[0]:.0f} MiB, "
              f"end {end:.0f} MiB; load average {os.getloadavg()}")
        if good_ok != n_good or bad_ok != args.requests - n_good or not alive or tracebacks:
            sys.exit(f"soak failed; the server's log: {log.name}")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
