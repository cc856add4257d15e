"""Cost of single-pass capture: (generation + capture + logit lens + layer strings) / plain greedy generation.

Same examples, same batch size, same stopping rule, in one process, alternating the two
so machine noise hits both. Also reports the lens's share of FLOPs (L x T x d x |V|).

    .venv/bin/python benchmarks/llm_capture.py [--llm smollm2_135m] [--examples 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from mice_exp.compose import as_plain, compose_config
from mice_exp.data.retrieval import SentenceEncoder, rank_demos
from mice_exp.llm.capture import generate_batch, generate_plain, lens_argmax
from mice_exp.llm.model import load_llm
from mice_exp.llm.prompt import build_prompt
from mice_exp.data import select_examples
from mice_exp.paths import paths_from


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llm", default="smollm2_135m")
    parser.add_argument("--examples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cfg = as_plain(compose_config([f"llm={args.llm}", "dataset.max_apis=3"]))
    paths = paths_from(cfg["paths"])
    selection = select_examples(cfg["dataset"], paths)
    examples = {e.id: e for e in selection.examples}
    demos = rank_demos(selection.examples, cfg["prompt"]["k_demos"], SentenceEncoder(None))
    llm = load_llm(cfg["llm"], paths.models)
    chosen = sorted(examples)[: args.examples]
    budget = cfg["llm"]["context_window"] - cfg["llm"]["max_new_tokens"]
    prompts = [build_prompt(examples[i], [examples[d] for d in demos[i]], llm.tokenizer, cfg["prompt"], budget).ids
               for i in chosen]
    size, max_new = int(cfg["llm"]["batch_size"]), int(cfg["llm"]["max_new_tokens"])
    batches = [prompts[lo:lo + size] for lo in range(0, len(prompts), size)]
    plain, capture, lens, tokens = 0.0, 0.0, 0.0, 0
    for _ in range(args.repeats):
        for batch in batches:
            start = time.perf_counter()
            generate_plain(llm, batch, max_new)
            plain += time.perf_counter() - start
            start = time.perf_counter()
            gens = generate_batch(llm, batch, max_new)
            for g in gens:
                llm.tokenizer.batch_decode(g.lens_ids.tolist(), skip_special_tokens=True)
            capture += time.perf_counter() - start
            n = sum(len(g.token_ids) for g in gens)
            tokens += n
            rows = torch.randn(n * (llm.n_layers - 1), llm.hidden_size, dtype=llm.model.dtype, device=llm.device)
            start = time.perf_counter()
            lens_argmax(llm, rows)  # the one batched logit-lens GEMM the capture cannot avoid
            lens += time.perf_counter() - start
    cfg_text = llm.model.config.get_text_config()
    d, vocab, L = cfg_text.hidden_size, cfg_text.vocab_size, llm.n_layers
    params = sum(p.numel() for p in llm.model.parameters())
    prompt_tokens = sum(len(p) for p in prompts) * args.repeats
    lens_flops = 2 * (L - 1) * tokens * d * vocab
    gen_flops = 2 * params * (prompt_tokens + tokens)
    print(f"llm={args.llm} examples={len(prompts)} batch_size={size} repeats={args.repeats} "
          f"threads={torch.get_num_threads()}")
    print(f"plain greedy generation   {plain:8.2f} s")
    print(f"generation + capture + lens + layer strings {capture:8.2f} s")
    print(f"one batched lens GEMM      {lens:8.2f} s")
    print(f"ratio to plain generation            {capture / plain:8.3f}x")
    print(f"ratio to plain generation + lens GEMM {capture / (plain + lens):8.3f}x  (target <= 1.1)")
    print(f"lens FLOPs / generation FLOPs  {lens_flops / gen_flops:.3f} "
          f"(generated tokens {tokens}, prompt tokens {prompt_tokens})")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
