"""`mice-exp serve` under concurrent clients: N chat requests one at a time, then the same N from C clients at once.

The server batches whatever waits when its LLM frees up (up to the gate's ``batch_size``); on ``llm.backend=vllm``
the batch is one engine call, whose sequences share the engine's steps. The requests are STE's queries of the
first ``--apis`` APIs (the gate's own data, each with its API's tools), each a fresh chat; the first request
warms the server up and is not timed. Prints both walls, the per-request p50, the throughput ratio
(concurrent / sequential), how many answers the two passes gave alike (a batch pads and rounds differently from
a single request), the server's CPU seconds, the CPU and the load average.

    .venv-vllm/bin/python benchmarks/serve_concurrency.py --serve-args llm.backend=vllm   # the engine
    .venv/bin/python benchmarks/serve_concurrency.py                                       # hf, the baseline

Time it on a quiet machine (load average < 1.5); ``--requests 2 --clients 2`` checks that it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from cputime import cpu_line, cpu_seconds
from gate_latency import requests
from serve_soak import post, start_server

from mice_exp.paths import PACKAGE_ROOT


def answer(body: dict) -> str:
    """What a response decided: its tool calls (name and arguments) or its text."""
    message = body["choices"][0]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    return json.dumps(calls) if calls else str(message.get("content"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(PACKAGE_ROOT / "experiments" / "abstention" / "gate-smollm2_135m"),
                        help="a gate folder or runs:/ URI")
    parser.add_argument("--apis", type=int, default=3, help="STE's queries of the first N APIs")
    parser.add_argument("--requests", type=int, default=16, help="timed requests (after one warm-up request)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--serve-args", nargs="*", default=[], help="more key=value arguments of mice-exp serve")
    args = parser.parse_args()

    print(cpu_line(), flush=True)
    queries = requests(args.apis, args.requests + 1)
    server, port, model, log = start_server(args.model, args.serve_args)
    try:
        bodies = [json.dumps({"model": model, "messages": messages, "tools": tools}).encode()
                  for messages, tools, _ in queries]

        def one(body: bytes) -> tuple[float, str]:
            tick = time.perf_counter()
            status, reply = post(port, body)
            if status != 200:
                raise SystemExit(f"the server answered {status}: {reply}; its log: {log.name}")
            return time.perf_counter() - tick, answer(reply)

        one(bodies[0])
        timed = bodies[1:]
        load = os.getloadavg()
        results = {}
        for name, clients in (("sequential", 1), (f"{args.clients} concurrent", args.clients)):
            cpu, tick = cpu_seconds([server.pid]), time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                out = list(pool.map(one, timed))
            wall = time.perf_counter() - tick
            results[name] = (wall, [a for _, a in out])
            print(f"{name}: {len(timed)} requests in {wall:.1f} s ({len(timed) / wall:.3f} req/s), p50 "
                  f"{np.median([t for t, _ in out]):.2f} s a request; server + client CPU "
                  f"{cpu_seconds([server.pid]) - cpu:.1f} s", flush=True)
        (seq_wall, seq), (con_wall, con) = results.values()
        alike = sum(a == b for a, b in zip(seq, con))
        print(f"concurrent / sequential throughput: {seq_wall / con_wall:.2f}x; answers alike {alike} / {len(seq)}; "
              f"load average {load} at the start, {os.getloadavg()} at the end; serve {' '.join(args.serve_args)}")
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
