"""Each ``llm.backend`` on the same STE calls, in one run: time, CPU time, and sameness with ``hf``.

For every backend asked for: wall and CPU time (this process and its children: vLLM's engine core, the
server behind ``openai``) for prefill alone (one new token), generation alone (no capture) and generation with
capture (what the stage runs); so the shares of prefill, decode and capture. Against ``hf``: calls whose
generated tokens are identical, labels identical, and the logit-lens token agreement of every layer on the
calls with identical tokens. ``openai`` is ``vllm serve`` of the same model folder on 127.0.0.1, started here.

    .venv-vllm/bin/python benchmarks/backends.py [--llm smollm2_135m] [--apis 3] [--backends hf,vllm,openai]
    .venv/bin/python benchmarks/backends.py --save-prompts prompts.json      # the prompt ids, for a GPU machine
    python benchmarks/backends.py --prompts prompts.json --llm llama3_1_8b_random --backends hf  # there

Run it on a quiet machine (load average < 1.5; printed at the start and the end). vLLM and the server start
outside the timed parts.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cputime import cpu_seconds  # noqa: E402  (benchmarks/, the script's own folder)
from mice_exp.llm import capture  # noqa: E402
from mice_exp.llm.local_server import vllm_server  # noqa: E402
from mice_exp.llm.backends import load_llm  # noqa: E402
from mice_exp.llm.model import model_folder  # noqa: E402
from mice_exp.llm.settings import LLMSettings  # noqa: E402
from mice_exp.llm.toolcall import REACT  # noqa: E402

clock = time.perf_counter


@contextmanager
def timed(into: dict[str, tuple[float, float]], name: str, extra: Sequence[int] = ()) -> Iterator[None]:
    start, cpu = clock(), cpu_seconds(extra)
    yield
    into[name] = (clock() - start, cpu_seconds(extra) - cpu)


def stage_prompts(cfg: dict[str, Any]) -> dict[str, Any]:
    """The stage's prompts (token ids), batches and examples for ``cfg``'s selection, as the stage builds them."""
    from mice_exp.llm.model import load_tokenizer
    from mice_exp.pipeline import Pipeline

    stage = Pipeline.from_config(cfg).stage
    selection = stage.selection
    demos = stage.demos(stage.folder()[0])
    tokenizer = load_tokenizer(cfg["llm"]["source"], stage.paths.models)
    examples = {e.id: e for e in selection.examples}
    runner = stage.runner(tokenizer)
    prompts = runner.prompts(examples, demos, examples)[0]
    return {"ids": {i: p.ids for i, p in prompts.items()}, "batches": runner.batches(prompts),
            "examples": examples}


def label_of(example: Any, text: str) -> int:
    from mice_exp.data.labels import is_correct
    from mice_exp.llm.toolcall import parse_call

    call = parse_call(text)
    return int(is_correct(example, call.api, call.args))


def run_backend(llm: Any, plain: Callable[[list[list[int]], int], list[list[int]]], prompts: dict[str, list[int]],
                batches: list[list[str]], max_new: int, extra: Sequence[int] = (),
                cold: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Prefill alone, generation alone and generation with capture over the same batches, each pass from a cold
    prefix cache (``cold`` empties vLLM's; otherwise a pass would reuse the prompts the one before it encoded)."""
    times: dict[str, tuple[float, float]] = {}
    plain([prompts[i] for i in batches[0]], 2)  # warm-up: first-call allocations and kernel choices stay out
    llm.generate([prompts[i] for i in batches[0]], 2, REACT)
    cold()
    with timed(times, "prefill", extra):
        for batch in batches:
            plain([prompts[i] for i in batch], 1)
    cold()
    tokens: dict[str, list[int]] = {}
    with timed(times, "generation", extra):
        for batch in batches:
            tokens |= dict(zip(batch, plain([prompts[i] for i in batch], max_new)))
    cold()
    gens: dict[str, Any] = {}
    with timed(times, "with capture", extra):
        for batch in batches:
            gens |= dict(zip(batch, llm.generate([prompts[i] for i in batch], max_new, REACT)))
    return {"times": times, "plain_tokens": tokens, "gens": gens}


def hf_plain(llm: Any) -> Callable[[list[list[int]], int], list[list[int]]]:
    def generate(prompts: list[list[int]], max_new: int) -> list[list[int]]:
        out = capture.generate_plain(llm, prompts, max_new)
        return [capture.truncate(llm.tokenizer, row.tolist(), llm.eos_ids())[0] for row in out]
    return generate


def vllm_plain(folder: Path, cfg: LLMSettings, llm: Any) -> tuple[Callable[[list[list[int]], int], list[list[int]]], Any]:
    """A second vLLM engine without the hidden-states extraction: generation alone, as a user would run it, its
    tokens cut where the stage cuts them (EOS, the call's stop); and the engine."""
    from vllm import LLM as Engine, SamplingParams, TokensPrompt

    engine = Engine(model=str(folder), tokenizer=str(folder), dtype="float32", seed=0,
                    max_model_len=int(cfg.context_window), max_num_seqs=int(cfg.batch_size),
                    enable_prefix_caching=True)

    def generate(prompts: list[list[int]], max_new: int) -> list[list[int]]:
        params = SamplingParams(temperature=0.0, max_tokens=max_new, stop_token_ids=llm.eos, detokenize=False)
        outs = engine.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [capture.truncate(llm.tokenizer, list(o.outputs[0].token_ids), llm.eos)[0] for o in outs]
    return generate, engine


def compare(name: str, result: dict[str, Any], reference: dict[str, Any] | None, examples: dict[str, Any]) -> str:
    gens = result["gens"]
    line = []
    if examples:
        correct = sum(label_of(examples[i], g.text) for i, g in gens.items())
        line.append(f"accuracy {correct / len(gens):.3f}")
    if reference is not None:
        ref = reference["gens"]
        same = [i for i in gens if gens[i].token_ids == ref[i].token_ids or
                (not gens[i].token_ids and gens[i].text == ref[i].text)]
        line.append(f"identical calls {len(same)}/{len(gens)}")
        if examples:
            labels = sum(label_of(examples[i], gens[i].text) == label_of(examples[i], ref[i].text) for i in gens)
            line.append(f"identical labels {labels}/{len(gens)}")
        lens = [(gens[i].lens_ids == ref[i].lens_ids).mean() for i in same
                if gens[i].lens_ids.size and gens[i].lens_ids.shape == ref[i].lens_ids.shape]
        if lens:
            line.append(f"logit-lens tokens agreeing {np.mean(lens):.4f} (mean over {len(lens)} identical calls)")
    same_plain = sum(result["plain_tokens"][i] == gens[i].token_ids for i in gens if gens[i].token_ids)
    line.append(f"generation alone = with capture: {same_plain}/{sum(bool(g.token_ids) for g in gens.values())}")
    return f"  {name}: " + "; ".join(line)


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = ["| backend | prefill s (CPU s) | generation alone s (CPU s) | with capture s (CPU s) | prefill / decode / "
            "capture share |", "|---|---|---|---|---|"]
    for name, result in results.items():
        t = result["times"]
        prefill, gen, full = t["prefill"][0], t["generation"][0], t["with capture"][0]
        shares = f"{prefill / full:.0%} / {max(gen - prefill, 0) / full:.0%} / {max(full - gen, 0) / full:.0%}"
        rows.append(f"| {name} | " + " | ".join(f"{t[k][0]:.1f} ({t[k][1]:.1f})" for k in
                                                 ("prefill", "generation", "with capture")) + f" | {shares} |")
    return "\n".join(rows)


def measure(name: str, cfg: dict[str, Any], llm_name: str, models: Path, prompts: dict[str, list[int]],
            batches: list[list[str]], max_new: int) -> dict[str, Any]:
    """One backend's times and generations; what it loaded is freed when this returns (two vLLM engines' KV
    caches left too little memory for the server that ``openai`` starts next)."""
    settings = LLMSettings.from_config(cfg["llm"])
    llm_cfg = settings.overridden(backend=name)
    if name == "hf":
        llm = load_llm(llm_cfg, models)
        return run_backend(llm, hf_plain(llm), prompts, batches, max_new)
    if name == "vllm":
        llm = load_llm(llm_cfg, models)
        plain, engine = vllm_plain(model_folder(settings, models), settings, llm)
        try:
            return run_backend(llm, plain, prompts, batches, max_new,
                               cold=lambda: (engine.reset_prefix_cache(), llm.engine.reset_prefix_cache()))
        finally:  # their engine processes outlive the objects: 7 GB that the kernel killed while the server ran
            for held in (engine, llm.engine):
                held.llm_engine.engine_core.shutdown()
    if name == "openai":
        os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # the server's /reset_prefix_cache
        with vllm_server(model_folder(settings, models), llm_name, int(settings.context_window)) as (url, pid):
            llm = load_llm(llm_cfg.overridden(base_url=url, model=llm_name), models)
            reset = urllib.request.Request(url.removesuffix("/v1") + "/reset_prefix_cache", method="POST")
            return run_backend(llm, lambda p, n: [g.token_ids for g in llm.generate(p, n, REACT)], prompts, batches,
                               max_new, extra=[pid], cold=lambda: urllib.request.urlopen(reset, timeout=60).close())
    raise SystemExit(f"--backends: {name!r}; expected some of hf, vllm, openai")


def main() -> None:
    from mice_exp.compose import as_plain, compose_config
    from mice_exp.paths import paths_from

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm", default="smollm2_135m")
    parser.add_argument("--apis", type=int, default=3, help="first N STE APIs (15 calls each)")
    parser.add_argument("--backends", default="hf,vllm,openai")
    parser.add_argument("--save-prompts", type=Path, help="write the prompt ids and batches here and stop")
    parser.add_argument("--prompts", type=Path, help="read prompt ids and batches from here (no data, no labels)")
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. paths.cache=DIR")
    args = parser.parse_args()
    overrides = [f"llm={args.llm}", f"dataset.max_apis={args.apis}", *args.overrides]
    cfg = as_plain(compose_config(overrides))
    if args.prompts:
        stage = json.loads(args.prompts.read_text()) | {"examples": {}}
    else:
        stage = stage_prompts(cfg)
    if args.save_prompts:
        args.save_prompts.write_text(json.dumps({"ids": stage["ids"], "batches": stage["batches"]}))
        print(f"{len(stage['ids'])} prompts in {len(stage['batches'])} batches -> {args.save_prompts}")
        return
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    device = "cuda" if torch.cuda.is_available() and cfg["llm"]["device"] in ("auto", "cuda") else "cpu"
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; device {device}"
          + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""))
    models = paths_from(cfg["paths"]).models
    max_new = args.max_new_tokens or int(cfg["llm"]["max_new_tokens"])
    prompts, batches = stage["ids"], stage["batches"]
    print(f"{args.llm}: {len(prompts)} calls in {len(batches)} batches, {sum(map(len, prompts.values()))} prompt "
          f"tokens, up to {max_new} new tokens each")
    results: dict[str, dict[str, Any]] = {}
    for name in args.backends.split(","):
        results[name] = measure(name, cfg, args.llm, models, prompts, batches, max_new)
        gc.collect()  # the backend's engines and KV caches go before the next one allocates its own
        print(f"{name}: with capture {results[name]['times']['with capture'][0]:.1f} s")
    print("\n" + table(results))
    reference = results.get("hf")
    for name, result in results.items():
        print(compare(name, result, reference if name != "hf" else None, stage["examples"]))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
