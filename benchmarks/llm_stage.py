"""The LLM stage against this CPU's floor, in one run.

Prints the CPU (model, AVX-512 / native bf16, torch's capability), the same-shape GEMM peak, then runs
the real LLM stage (`LLMStage.run`, a fresh cache) on the first `--apis` STE APIs and breaks its wall
time down: retrieval, model load, prompts, prefill, decode, generate's own per-step work, logit lens,
layer strings, records, cache writes. Each phase gets its FLOPs (linear layers, attention with its
causal half, lm_head, lens) and achieved GFLOP/s; the stage's floor is its FLOPs at the GEMM peak.
Then, on the same batches, plain greedy generation (transformers' stock cache) plus the one lens GEMM
the capture cannot avoid: the capture's overhead ratio, and whether every generated token is the same.
Where the CPU has native bf16, the stage runs again in bf16: speed-up and identical calls / labels.

    .venv/bin/python benchmarks/llm_stage.py [--llm smollm2_135m] [--apis 3] [--no-plain] [--bf16 auto|yes|no]

Run it on a quiet machine (load average < 1.5; printed at the start and the end).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

import mice_exp.llm.capture as capture
import mice_exp.llm.model as model_module
import mice_exp.llm.runner as runner
import mice_exp.llm.stage as stage
from mice_exp.compose import as_plain, compose_config
from mice_exp.llm.backends import load_llm
from mice_exp.llm.headroom import peak_bytes
from mice_exp.llm.memory import keep_freed_memory
from mice_exp.llm.precision import native_bf16
from mice_exp.llm.records import read_stage
from mice_exp.llm.settings import LLMSettings, PromptSettings
from mice_exp.paths import paths_from
from mice_exp.pipeline import Pipeline

from cputime import cpu_line  # noqa: E402  (benchmarks/, the script's own folder)

clock = time.perf_counter



def gemm_rate(m: int, k: int, n: int, dtype: torch.dtype, seconds: float = 2.0) -> float:
    """Best GFLOP/s of ``linear(x[m,k], W[n,k])`` (the model's own op) over repeats within ``seconds``."""
    x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    torch.nn.functional.linear(x, w)
    best, start = float("inf"), clock()
    while clock() - start < seconds:
        t = clock()
        torch.nn.functional.linear(x, w)
        best = min(best, clock() - t)
    return 2 * m * k * n / best / 1e9


def copy_bandwidth(megabytes: int = 400, seconds: float = 2.0) -> float:
    """Best GB/s (bytes read + written) of copying a tensor far larger than the caches."""
    x = torch.randn(megabytes * 2**18)
    y = torch.empty_like(x)
    y.copy_(x)
    best, start = float("inf"), clock()
    while clock() - start < seconds:
        t = clock()
        y.copy_(x)
        best = min(best, clock() - t)
    return 2 * x.numel() * 4 / best / 1e9


class Phases:
    """Wall seconds per phase, from wrappers around the stage's own functions and forward hooks."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.forwards: list[tuple[int, int, float]] = []  # (batch, new tokens, seconds) per model forward

    def wrap(self, owner: Any, name: str, phase: str) -> Callable[[], None]:
        real = getattr(owner, name)

        def timed(*args, **kwargs):
            start = clock()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[phase] += clock() - start
        setattr(owner, name, timed)
        return lambda: setattr(owner, name, real)

    def hook(self, model: Any) -> None:
        started: list[float] = []

        def pre(module, args, kwargs):
            started.append(clock())

        def post(module, args, kwargs, output):
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.forwards.append((ids.shape[0], ids.shape[1], clock() - started.pop()))
        model.register_forward_pre_hook(pre, with_kwargs=True)
        model.register_forward_hook(post, with_kwargs=True)


@contextmanager
def instrumented(phases: Phases) -> Iterator[dict[str, Any]]:
    """Time the stage's phases; yields a dict that receives the loaded LLM."""
    holder: dict[str, Any] = {}
    real_load = model_module.load_hf

    def load(*args, **kwargs):
        start = clock()
        llm = real_load(*args, **kwargs)
        phases.seconds["model load"] += clock() - start
        phases.hook(llm.model)
        phases.wrap(llm.tokenizer, "batch_decode", "layer strings")
        holder["llm"] = llm
        return llm
    undo = [phases.wrap(stage.LLMStage, "demos", "retrieval (encoder load + ranking)"), phases.wrap(runner.PromptBuilder, "build", "prompts"),
            phases.wrap(capture, "generate_ids", "generate"), phases.wrap(capture, "lens_argmax", "logit lens"),
            phases.wrap(capture, "truncate", "truncation"), phases.wrap(runner, "make_record", "records"),
            phases.wrap(stage, "write_npz", "cache writes"), phases.wrap(stage, "write_jsonl", "cache writes"),
            phases.wrap(runner, "generate_batch", "batch loop")]
    model_module.load_hf = load
    try:
        yield holder
    finally:
        model_module.load_hf = real_load
        for restore in undo:
            restore()


def model_shapes(llm: Any) -> dict[str, Any]:
    text = llm.model.config.get_text_config()
    linear = sum(m.weight.numel() for layer in llm.layers for m in layer.modules() if isinstance(m, torch.nn.Linear))
    heads, head_dim = text.num_attention_heads, getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    types = getattr(text, "layer_types", None) or ["full_attention"] * llm.n_layers
    window = getattr(text, "sliding_window", None) or 10**9
    kv = 2 * text.num_key_value_heads * head_dim * llm.model.dtype.itemsize  # K and V bytes per token and layer
    return {"linear": linear, "qk": heads * head_dim, "d": text.hidden_size, "vocab": text.vocab_size, "kv": kv,
            "weight_bytes": (linear + text.hidden_size * text.vocab_size) * llm.model.dtype.itemsize,
            "L": llm.n_layers, "windows": [window if t == "sliding_attention" else 10**9 for t in types]}


def causal_pairs(p: int, window: int) -> int:
    """Query-key pairs of causal attention over p tokens, each seeing at most ``window`` keys."""
    w = min(p, window)
    return w * (w + 1) // 2 + (p - w) * w


def stage_flops(records: list[dict[str, Any]], shapes: dict[str, Any]) -> dict[str, float]:
    """Useful FLOPs of every call: its own prompt and generated tokens, no padding, causal attention
    (QK^T and PV: 4 FLOPs per query-key pair and query-head dimension)."""
    lin, qk, d, vocab, L, windows = (shapes[k] for k in ("linear", "qk", "d", "vocab", "L", "windows"))
    out: dict[str, float] = defaultdict(float)
    for r in records:
        p, t = r["prompt_tokens"], len(r["token_ids"])
        out["prefill linear"] += 2 * lin * p + 2 * d * vocab  # + lm_head at the last position
        out["prefill attention"] += sum(4 * qk * causal_pairs(p, w) for w in windows)
        steps = max(t - 1, 0)  # the first token comes from the prefill
        out["decode"] += steps * (2 * lin + 2 * d * vocab) + sum(
            4 * qk * min(p + s, w) for s in range(1, steps + 1) for w in windows)
        out["logit lens"] += 2 * d * vocab * (L - 1) * t
    return dict(out)


def batch_ids(records: list[dict[str, Any]], size: int) -> list[list[str]]:
    """The stage's batches (by prompt length, then id), rebuilt from its records."""
    order = sorted(records, key=lambda r: (r["prompt_tokens"], r["id"]))
    return [[r["id"] for r in order[lo:lo + size]] for lo in range(0, len(order), size)]


def run_stage(cfg: dict[str, Any], cache: Path, models: Path) -> tuple[Phases, float, dict[str, Any]]:
    cfg = {**cfg, "paths": {**cfg["paths"], "cache": str(cache)}}
    cache.mkdir(parents=True)
    os.symlink(models, cache / "models")  # the converted weights are not part of the stage
    phases = Phases()
    with instrumented(phases) as holder:
        start = clock()
        folder = Pipeline.from_config(cfg).stage.run()
        wall = clock() - start
    return phases, wall, {"records": read_stage(folder).records, "llm": holder["llm"], "cfg": cfg}


def decode_bytes(phases: Phases, shapes: dict[str, Any], prompt_width: list[int]) -> float:
    """Bytes a decode step must read from memory: every weight (linear layers and lm_head) once, and the
    batch's KV cache of every layer; at batch 8 they, not the FLOPs, bound the step."""
    total, batch = 0.0, -1
    for rows, new, _ in phases.forwards:
        if new > 1:  # a prefill starts the next batch: its prompts' padded width
            batch += 1
            context = prompt_width[batch]
            continue
        context += 1
        total += shapes["weight_bytes"] + rows * context * shapes["kv"] * shapes["L"]
    return total


def report(phases: Phases, wall: float, flops: dict[str, float], peak: float, decode_floor: float) -> float:
    s = phases.seconds
    prefill = sum(sec for _, n, sec in phases.forwards if n > 1)
    decode = sum(sec for _, n, sec in phases.forwards if n == 1)
    rows = [("retrieval (SentenceBERT)", s["retrieval (encoder load + ranking)"], 0.0), ("model load", s["model load"], 0.0),
            ("prompts", s["prompts"], 0.0),
            ("prefill (model forwards)", prefill, flops["prefill linear"] + flops["prefill attention"]),
            ("decode (model forwards)", decode, flops["decode"]),
            ("generate's own per-step work", s["generate"] - prefill - decode, 0.0),
            ("logit lens GEMM + argmax", s["logit lens"], flops["logit lens"]),
            ("truncation at the stop", s["truncation"], 0.0), ("layer strings (decode)", s["layer strings"], 0.0),
            ("records", s["records"], 0.0), ("cache writes", s["cache writes"], 0.0)]
    rows.append(("other (capture glue, stage)", wall - sum(sec for _, sec, _ in rows), 0.0))
    total_flops = sum(flops.values())
    print(f"\n{'phase':<32}{'seconds':>9}{'share':>8}{'TFLOP':>8}{'GFLOP/s':>9}")
    for name, sec, fl in rows:
        rate = f"{fl / sec / 1e9:9.1f}" if fl and sec > 0 else f"{'':>9}"
        print(f"{name:<32}{sec:9.2f}{sec / wall:8.1%}{fl / 1e12:8.3f}{rate}")
    print(f"{'stage wall':<32}{wall:9.2f}{1:8.1%}{total_flops / 1e12:8.3f}{total_flops / wall / 1e9:9.1f}")
    floor = total_flops / (peak * 1e9)
    loop = s["batch loop"]
    print(f"floor (FLOPs at the {peak:.1f} GFLOP/s GEMM peak): {floor:.2f} s; stage wall / floor {wall / floor:.3f}x; "
          f"batch loop ({loop:.2f} s, generation + capture + lens) / floor {loop / floor:.3f}x")
    roofline = floor - flops["decode"] / (peak * 1e9) + max(decode_floor, flops["decode"] / (peak * 1e9))
    print(f"roofline floor (decode at memory bandwidth instead: {decode_floor:.2f} s): {roofline:.2f} s; "
          f"stage wall / roofline floor {wall / roofline:.3f}x")
    return wall / floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm", default="smollm2_135m")
    parser.add_argument("--apis", type=int, default=3, help="first N STE APIs (15 calls each)")
    parser.add_argument("--no-plain", action="store_true", help="skip plain generation (the capture ratio)")
    parser.add_argument("--bf16", choices=["auto", "yes", "no"], default="auto", help="auto: where native")
    args = parser.parse_args()
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    print("CPU:", cpu_line())
    cfg = as_plain(compose_config([f"llm={args.llm}", f"dataset.max_apis={args.apis}", "llm.dtype=float32"]))
    tmp = Path(tempfile.mkdtemp(prefix="llm_stage_"))
    models = paths_from(cfg["paths"]).models
    load_llm(LLMSettings.from_config(cfg["llm"]), models)  # converts packaged weights once, before anything is timed
    print("allocator: freed memory kept on the heap (mice_exp/llm/memory.py):", keep_freed_memory())
    phases, wall, out = run_stage(cfg, tmp / "fp32", models)
    llm, records = out["llm"], out["records"]
    shapes = model_shapes(llm)
    batch = int(cfg["llm"]["batch_size"])
    prompt_rows = batch * round(sum(r["prompt_tokens"] for r in records) / len(records))
    peaks = {"prefill-shaped": gemm_rate(prompt_rows, shapes["d"], 1536, torch.float32),
             "lens-shaped": gemm_rate(capture.LENS_ROWS, shapes["d"], shapes["vocab"], torch.float32),
             "decode-shaped": gemm_rate(batch, shapes["d"], 1536, torch.float32)}
    print("fp32 GEMM GFLOP/s, linear(x, W):", ", ".join(f"{k} {v:.1f}" for k, v in peaks.items()))
    peak = max(peaks.values())
    bandwidth = copy_bandwidth()
    print(f"memory bandwidth (400 MB copy, read + write): {bandwidth:.1f} GB/s")
    tokens = sum(len(r["token_ids"]) for r in records)
    print(f"\n{args.llm}, {len(records)} calls, batch {batch}, fp32: {sum(r['prompt_tokens'] for r in records)} prompt "
          f"tokens, {tokens} generated; accuracy {sum(r['label'] for r in records) / len(records):.3f}")
    widths = [max(r["prompt_tokens"] for r in records if r["id"] in set(b)) for b in batch_ids(records, batch)]
    report(phases, wall, stage_flops(records, shapes), peak, decode_bytes(phases, shapes, widths) / (bandwidth * 1e9))
    print(f"per call: {wall / len(records):.2f} s (stage), peak RSS {peak_bytes() / 2**20:.0f} MiB")

    if not args.no_plain:
        plain_vs_capture(out["cfg"], llm, records, tmp, phases.seconds["batch loop"] + phases.seconds["layer strings"])
    if args.bf16 == "yes" or (args.bf16 == "auto" and native_bf16()):
        bf16_cfg = {**cfg, "llm": {**cfg["llm"], "dtype": "bfloat16"}}
        bf_phases, bf_wall, bf_out = run_stage(bf16_cfg, tmp / "bf16", models)
        same = {k: sum(a[k] == b[k] for a, b in zip(records, bf_out["records"])) for k in ("text", "pred_api", "label")}
        same["call"] = sum((a["pred_api"], a["pred_args"]) == (b["pred_api"], b["pred_args"])
                           for a, b in zip(records, bf_out["records"]))
        print(f"\nbf16: stage {bf_wall:.1f} s vs fp32 {wall:.1f} s (speed-up {wall / bf_wall:.2f}x); identical to fp32: "
              + ", ".join(f"{k} {v}/{len(records)}" for k, v in same.items()))
    else:
        print("\nbf16: not measured (this CPU has no native bf16: it would be emulated, several times slower)")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def plain_vs_capture(cfg: dict[str, Any], llm: Any, records: list[dict[str, Any]], tmp: Path, captured: float) -> None:
    """Plain greedy generation (transformers' stock DynamicCache) + the lens GEMM on the same batches."""
    from mice_exp.data import select_examples
    from mice_exp.cache import read_json

    paths = paths_from(cfg["paths"])
    examples = {e.id: e for e in select_examples(cfg["dataset"], paths).examples}
    folder = next((tmp / "fp32" / "llm").iterdir())
    demos = read_json(folder / "demos.json")
    settings = PromptSettings.from_config(cfg["prompt"]), LLMSettings.from_config(cfg["llm"])
    llm_runner = runner.Runner.from_config(*settings, llm.tokenizer)
    prompts = llm_runner.prompts(examples, demos, examples)[0]
    by_id = {r["id"]: r for r in records}
    max_new = int(cfg["llm"]["max_new_tokens"])
    plain = lens = 0.0
    same = 0
    with torch.inference_mode():
        for batch in llm_runner.batches(prompts):
            start = clock()
            out = capture.generate_plain(llm, [prompts[i].ids for i in batch], max_new, llm_runner.fmt)
            plain += clock() - start
            for i, row in zip(batch, out):
                ids, _, _ = capture.truncate(llm.tokenizer, row.tolist(), llm.eos_ids(), llm_runner.fmt)
                same += ids == by_id[i]["token_ids"]
            n = sum(len(by_id[i]["token_ids"]) for i in batch) * (llm.n_layers - 1)
            rows = torch.randn(n, llm.hidden_size, dtype=llm.model.dtype)
            start = clock()
            capture.lens_argmax(llm, rows)
            lens += clock() - start
    print(f"\nplain greedy generation {plain:.2f} s + one lens GEMM {lens:.2f} s on the same {len(records)} calls; "
          f"generated tokens identical to the capture's for {same}/{len(records)} calls")
    print(f"capture (generation + capture + lens + layer strings, {captured:.2f} s) / (plain + lens GEMM) "
          f"= {captured / (plain + lens):.3f}x (target <= 1.1)")

if __name__ == "__main__":
    main()
