"""The vLLM engine's start-up under ``llm.backend=vllm``, with vLLM's AOT compilation and without it (the
backend's default on a CPU), each started ``--runs`` times in a fresh process after one start that fills the cache.

    .venv-vllm/bin/python benchmarks/engine_start.py [--llm smollm2_135m] [--runs 2]

Prints each start's wall time (the backend's whole ``load``: the lens model, the engine, its compilation or the
cache's load, warm-up) and the engine's own "init engine" seconds from vLLM's log.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from cputime import cpu_line  # benchmarks/, the script's own folder

INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
LOAD = ("from mice_exp.compose import as_plain, compose_config\nfrom mice_exp.llm.backends import load_llm\n"
        "from mice_exp.llm.settings import LLMSettings\nfrom mice_exp.paths import paths_from\n"
        "if __name__ == '__main__':\n"
        "    cfg = as_plain(compose_config(['llm={llm}', 'llm.backend=vllm']))\n"
        "    load_llm(LLMSettings.from_config(cfg['llm']), paths_from(cfg['paths']).models)\n")


def start(llm: str, aot: str) -> tuple[float, float]:
    """One engine start in a fresh Python: (wall seconds, vLLM's init-engine seconds)."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", LOAD.format(llm=llm)], env={**os.environ, "VLLM_USE_AOT_COMPILE": aot},
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    found = INIT.findall(done.stdout + done.stderr)
    if done.returncode or not found:
        sys.exit(f"engine_start: the engine did not start (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return wall, float(found[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llm", default="smollm2_135m")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    print(f"{args.llm}; {cpu_line()}; load average at start {os.getloadavg()}", flush=True)
    for aot, name in (("1", "AOT compile (vLLM's default)"), ("0", "no AOT (llm.backend=vllm's on a CPU)")):
        start(args.llm, aot)  # fills this mode's cache
        for run in range(args.runs):
            wall, init = start(args.llm, aot)
            print(f"{name:38s} start {run + 1}: {wall:6.1f} s (init engine {init:5.1f} s)", flush=True)
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
