"""The logit lens screened in bf16 against the float32 lens, on the states of real calls.

For the first ``--calls`` STE calls of ``dataset.max_apis=3``, the published SmolLM2 gate's prompt and the query's
gold call are teacher-forced through SmolLM2 (:func:`mice_exp.llm.teacher._forward`), and the lens of layers
1..L-1 at every reply position is computed both ways: :meth:`LLM.blocked_argmax` (every logit in float32) and
:func:`mice_exp.llm.model.screened_argmax` (bf16 first, float32 for the few tokens that can win). Prints the
mean time per call of each (the first call untimed), their ratio, and how many lens tokens differ (expected 0).

    .venv/bin/python benchmarks/lens_screen.py [--calls 12]

A CPU without bf16 in hardware (AMX, AVX512-BF16) emulates it: the screen is slower there and the lens does not
use it (:func:`mice_exp.llm.model.native_bf16`).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from cputime import cpu_line  # benchmarks/, the script's own folder
from gate_latency import requests
from mice_exp.gate import Gate
from mice_exp.llm.teacher import _forward
from mice_exp.paths import PACKAGE_ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=12)
    args = parser.parse_args()
    print(f"{cpu_line()}; load average at start {os.getloadavg()}")
    gate = Gate.load(PACKAGE_ROOT / "experiments" / "abstention" / "gate-smollm2_135m")
    llm, fmt = gate.llm(), gate.builder().fmt
    items = requests(3, args.calls)
    prompts = gate._prompts(gate._chat_examples([(m, t) for m, t, _ in items]))[0].prompts
    times: dict[bool, list[float]] = {False: [], True: []}
    rows = differ = 0
    with torch.inference_mode():
        for i, (_, _, call) in enumerate(items):
            reply = llm.tokenizer.encode(fmt.write(call["function"]["name"], call["function"]["arguments"]),
                                         add_special_tokens=False)
            states = _forward(llm, [prompts[i].ids], [reply], logits=False)[0][0]
            hidden = states[:, :llm.n_layers - 1].reshape(-1, states.shape[-1])
            found = {}
            for screen in (False, True):
                llm.lens_screen = screen
                tick = time.perf_counter()
                found[screen] = llm.lens_argmax(hidden)
                times[screen].append(time.perf_counter() - tick)
            rows, differ = rows + len(hidden), differ + int((found[False] != found[True]).sum())
    float32, screened = (sum(times[s][1:]) / (len(items) - 1) for s in (False, True))
    print(f"{len(items)} calls, {rows / len(items):.0f} lens rows each ({llm.n_layers - 1} layers x reply tokens), "
          f"vocabulary {llm.model.get_output_embeddings().weight.shape[0]}")
    print(f"float32 lens {float32:.3f} s per call, screened {screened:.3f} s: {float32 / screened:.2f}x; "
          f"lens tokens that differ: {differ} of {rows}")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
