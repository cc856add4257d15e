"""Gate latency: generate-and-check vs scoring a given call vs one plain forward pass, sequential and concurrent.

On STE's queries of the first ``--apis`` APIs (3: 45 queries), with a saved gate (default: the SmolLM2 STE gate
of ``experiments/abstention``), per request:

* ``check``: :meth:`Gate.check`, the gate's own call generated greedily with capture, then scored;
* ``score``: :meth:`Gate.score` of the same call (the gate's own where it made one, else the query's gold
  call), teacher-forced in one forward pass, then the same features and estimator;
* ``forward``: one plain forward pass of the gate's LLM over the same prompt and call (no capture, no lens, no
  features): the floor, since scoring a call cannot be cheaper than one prefill of it.
* ``full`` (``--full-pass``): ``score`` with every layer kept and the lens computed whatever the gate reads (what
  every scored call cost before :meth:`Gate.reads`);
* ``forward0``: the same forward pass over the zero-shot prompt (no demonstrations) and the same call: what a
  shorter prompt buys (a gate fitted zero-shot would pay this floor instead).

It also prints the prompts' mean length with and without demonstrations and the prefix every prompt shares (what
a cache of a shared prefix could skip).

Sequentially (one request at a time) and 8 concurrent (``--concurrency``: the requests in batches of 8, as a
server's queue hands them to ``check_batch`` / ``score_batch``, and one padded forward pass of 8 rows), it prints
p50 / p95 latency per request, throughput, and the ratios the issue asks for (score / forward, score / check at
p50; concurrent / sequential throughput), with the CPU, torch's threads and the load average at start and end.

    .venv/bin/python benchmarks/gate_latency.py [--gate experiments/abstention/gate-smollm2_135m] [--apis 3]
        [--limit N] [--concurrency 8] [--models .cache/models]
    .venv-vllm/bin/python benchmarks/gate_latency.py --backend vllm ...   # the gate's LLM on the engine

Under ``--backend vllm`` the engine's prefix cache is emptied before every timed pass: check, score and the
forward passes share their prompts, and a pass would otherwise reuse the one before it.

On a GPU (``benchmarks/gpu_check.sh``) the gate's LLM runs on CUDA; each timed forward pass waits for the device
before its clock stops.

A scored call's pass computes only what the gate reads (:meth:`Gate.reads`): a confidence-only gate's is the plain
forward pass with the call's logits. One to time, from the published SmolLM2 records (seconds, no LLM):

    .venv/bin/mice-exp llm=smollm2_135m llm.records=experiments/records/ste-smollm2_135m.jsonl.gz features=conf_only \
        estimator=mice_lr tracking.enabled=false permutations=0    # prints "gate saved: <folder>"

Time it on a quiet machine (load average < 1.5); ``--limit 2`` checks that it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from mice_exp.compose import as_plain, compose_config
from mice_exp.data import select_examples
from mice_exp.gate import Gate
from mice_exp.paths import PACKAGE_ROOT, paths_from

clock = time.perf_counter


def requests(apis: int, limit: int | None) -> list[tuple[list[dict], list[dict], dict]]:
    """(messages, tools, gold call) of each STE query of the first ``apis`` APIs, in the data set's order."""
    cfg = as_plain(compose_config([f"dataset.max_apis={apis}"]))
    examples = select_examples(cfg["dataset"], paths_from(cfg["paths"])).examples[:limit]
    out = []
    for e in examples:
        gold = e.gold["action_input"]
        arguments = gold if isinstance(gold, str) else json.dumps(gold or {}, ensure_ascii=False)
        out.append(([{"role": "user", "content": e.query}], e.schemas,
                    {"type": "function", "function": {"name": e.gold["action"], "arguments": arguments}}))
    return out


def timed(run: Callable[[Sequence[Any]], Any], items: Sequence[Any], size: int) -> tuple[list[float], float]:
    """Each item's latency (its batch's wall time) and the total wall time, running ``items`` in batches of
    ``size``."""
    latencies, start = [], clock()
    for lo in range(0, len(items), size):
        tick = clock()
        run(items[lo:lo + size])
        latencies += [clock() - tick] * len(items[lo:lo + size])
    return latencies, clock() - start


def plain_forward(llm: Any, rows: Sequence[Sequence[int]]) -> None:
    """One forward pass over left-padded rows, the last position's logits only: no capture, no lens."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), llm.tokenizer.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row):], mask[b, width - len(row):] = torch.tensor(row), 1
    with torch.inference_mode():
        llm.model(input_ids=ids.to(llm.device), attention_mask=mask.to(llm.device),
                  position_ids=(mask.cumsum(1) - 1).clamp(min=0).to(llm.device), use_cache=False, logits_to_keep=1)
    if llm.device.type == "cuda":  # kernels run asynchronously: the clock stops when they finish
        torch.cuda.synchronize(llm.device)


def engine_forward(engine: Any, rows: Sequence[Sequence[int]]) -> None:
    """The floor on vLLM: one prefill of each row with one new token, in one engine call; the engine's forward
    extracts every layer as ever, but no request writes its states out (what scoring reads back is its own cost)."""
    from vllm import SamplingParams, TokensPrompt

    from mice_exp.llm.backends.vllm import NO_STATES

    engine.engine.generate([TokensPrompt(prompt_token_ids=list(r)) for r in rows],
                           SamplingParams(temperature=0.0, max_tokens=1, detokenize=False,
                                          extra_args={"kv_transfer_params": {NO_STATES: True}}), use_tqdm=False)


def empty_prefix_cache(engine: Any, tries: int = 100) -> None:
    """Empty the engine's prefix cache before a timed pass. vLLM refuses while any block is still held (a request's
    states not yet written out) and only logs it: a pass timed after a refusal reuses the previous pass's prompts
    (the 8-concurrent forward of 2026-11-28 20:09 read 3.56x that way), so wait until it takes, or stop."""
    for _ in range(tries):
        if engine.reset_prefix_cache():
            return
        time.sleep(0.1)
    raise SystemExit(f"gate_latency: the engine kept its prefix cache through {tries} resets; expected it emptied")


def own_call(decision: Any, gold: dict) -> dict:
    """The gate's own call as a host would hand it back (its argument JSON as written), or ``gold`` where the
    gate made none."""
    if decision.call is None:
        return gold
    return {"type": "function", "function": {"name": decision.call.name, "arguments": decision.call.arguments_json}}


def score_parts(parts: dict[str, float], n: int) -> str:
    """Where a scored request's time went (:attr:`Gate.timing` summed over the pass): what a batch's speed-up
    is held back by (on the H200, 2026-11-28, score gained 0.76x from batches of 8 where the forward pass gained
    1.44x)."""
    named = {"prepare_s": "prompts", "forward_s": "teacher-forced pass", "records_s": "records",
             "features_s": "features + estimator"}
    shown = {label: parts.get(key, 0.0) for key, label in named.items()}
    shown["the rest (the reply's tokens)"] = parts.get("total_s", 0.0) - sum(shown.values())
    return ", ".join(f"{label} {1000 * seconds / n:.1f} ms" for label, seconds in shown.items())


def summary(name: str, latencies: list[float], wall: float) -> dict[str, float]:
    p50, p95 = np.percentile(latencies, [50, 95])
    print(f"  {name:8s} p50 {p50:7.3f} s  p95 {p95:7.3f} s  throughput {len(latencies) / wall:6.3f} requests/s")
    return {"p50": float(p50), "p95": float(p95), "throughput": len(latencies) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gate", default=str(PACKAGE_ROOT / "experiments" / "abstention" / "gate-smollm2_135m"))
    parser.add_argument("--apis", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="only the first N queries (a check that it runs)")
    parser.add_argument("--concurrency", type=int, default=8, help="1: one request at a time only")
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="what runs the gate's LLM")
    parser.add_argument("--full-pass", action="store_true",
                        help="also score with every layer and the lens computed, whatever the gate reads ('full')")
    parser.add_argument("--models", type=Path, default=None,
                        help="the model cache the gate's LLM is loaded or converted into (default: .cache/models)")
    args = parser.parse_args()
    print(f"load average at start {os.getloadavg()}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} cores")
    gate = Gate.load(Path(args.gate), models=args.models, engine={"backend": args.backend})
    gate.warm()
    llm = gate.llm()
    forward = (lambda b: engine_forward(llm, b)) if args.backend == "vllm" else (lambda b: plain_forward(llm, b))
    cold = (lambda: empty_prefix_cache(llm.engine)) if args.backend == "vllm" else (lambda: None)
    items = requests(args.apis, args.limit)
    print(f"gate {gate.describe()} on {args.backend}; {len(items)} queries of the first {args.apis} STE APIs")
    lens, states = gate.reads()
    print(f"a scored call's pass computes {'the logit lens' if lens else 'no logit lens'} and keeps "
          f"{'every layer' if states else 'no layer'} (what the gate's view and estimator read)")
    results: dict[str, dict[str, dict[str, float]]] = {}
    modes = [("sequential", 1)] + ([(f"{args.concurrency} concurrent", args.concurrency)] if args.concurrency > 1 else [])
    fmt, tokenizer = gate.builder().fmt, llm.tokenizer
    examples = gate._chat_examples([(m, t) for m, t, _ in items])
    prompts = gate._prompts(examples)[0].prompts  # the same messages and tools in every pass: built once
    few_shot = [prompts[i].ids for i in sorted(prompts)]
    zero_shot = [gate.builder().build(examples[i], [], 10**9).ids for i in sorted(examples)]
    print(f"prompt tokens: mean {np.mean([len(p) for p in few_shot]):.0f} as the gate builds them "
          f"({gate.prompt_settings.k_demos} demonstrations), {np.mean([len(p) for p in zero_shot]):.0f} zero-shot; "
          f"the prefix all {len(few_shot)} share: {len(os.path.commonprefix(few_shot))} tokens")
    for mode, size in modes:
        print(mode)
        # one untimed batch of this size first: a GPU picks its kernels per shape on first use
        warm = [(m, t) for m, t, _ in items[:size]]
        gate.check_batch(warm)
        gate.score_batch([(m, t, gold) for m, t, gold in items[:size]])
        decisions: list[Any] = []
        cold()
        lat, wall = timed(lambda b: decisions.extend(gate.check_batch([(m, t) for m, t, _ in b])), items, size)
        results.setdefault(mode, {})["check"] = summary("check", lat, wall)
        scored = [(m, t, own_call(d, gold)) for (m, t, gold), d in zip(items, decisions)]
        cold()
        parts: dict[str, float] = {}

        def score(batch: Sequence[Any]) -> None:
            gate.score_batch(batch)
            for key, seconds in gate.timing.items():
                parts[key] = parts.get(key, 0.0) + seconds

        lat, wall = timed(score, scored, size)
        results[mode]["score"] = summary("score", lat, wall)
        print("    per request: " + score_parts(parts, len(scored)))
        if args.full_pass:  # the same calls, the pass capturing every layer and the lens whatever the gate reads
            cold()
            gate.reads = lambda: (True, True)
            lat, wall = timed(gate.score_batch, scored, size)
            del gate.reads  # the gate's own again
            full = results[mode]["score_full"] = summary("full", lat, wall)
            print(f"  score / full pass at p50 {results[mode]['score']['p50'] / full['p50']:.2f}x")
        rows = [prompts[i].ids + tokenizer.encode(fmt.write(c["function"]["name"], c["function"]["arguments"]),
                                                  add_special_tokens=False) for i, (_, _, c) in enumerate(scored)]
        forward(rows[:size])
        cold()
        lat, wall = timed(forward, rows, size)
        results[mode]["forward"] = summary("forward", lat, wall)
        short = [zero_shot[i] + row[len(prompts[i].ids):] for i, row in enumerate(rows)]
        forward(short[:size])
        cold()
        lat, wall = timed(forward, short, size)
        results[mode]["forward0"] = summary("forward0", lat, wall)
        r = results[mode]
        print(f"  score / forward at p50 {r['score']['p50'] / r['forward']['p50']:.2f}x; "
              f"score / check at p50 {r['score']['p50'] / r['check']['p50']:.2f}x")
    if len(modes) > 1:
        seq, con = results["sequential"], results[modes[1][0]]
        for name in ("check", "score", "forward", "forward0"):
            print(f"{name}: {args.concurrency} concurrent / sequential throughput "
                  f"{con[name]['throughput'] / seq[name]['throughput']:.2f}x")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
