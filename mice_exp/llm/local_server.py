"""A ``vllm serve`` of a local model folder on 127.0.0.1, started and stopped around a block (the tests of
``llm.backend=openai`` and ``benchmarks/backends.py``: a real OpenAI-compatible server, no network)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def vllm_server(folder: Path, name: str, context: int, python: str = sys.executable) -> Iterator[tuple[str, int]]:
    """``vllm serve`` of ``folder`` on 127.0.0.1 (base URL, server pid), stopped on exit. On a CPU its KV cache
    takes ``$VLLM_CPU_KVCACHE_SPACE`` GiB (2 unless set), not vLLM's default share of the whole memory."""
    port = free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-serve-{port}.log", "w")
    server = subprocess.Popen([python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
                               "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
                               "--dtype", "float32", "--max-model-len", str(context), "--seed", "0",
                               "--max-logprobs", "20", "--enable-prefix-caching"],
                              stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")})
    try:
        deadline = time.time() + 600
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"vllm serve did not start; see {log.name}") from None
                time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1", server.pid
    finally:
        server.terminate()
        server.wait(60)
