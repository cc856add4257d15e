"""The benchmark scripts still run against the code they measure (on tiny_random: nothing is timed here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_llm_stage_benchmark_breaks_a_tiny_stage_into_phases_and_a_floor():
    # two APIs: under prompt.demo_pool=train one API's 8 training calls cannot give a training call 8 others
    out = subprocess.run([sys.executable, "benchmarks/llm_stage.py", "--llm", "tiny_random", "--apis", "2", "--no-plain"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert out.returncode == 0, out.stderr[-2000:]
    for line in ("prefill (model forwards)", "logit lens GEMM + argmax", "stage wall", "stage wall / floor"):
        assert line in out.stdout
