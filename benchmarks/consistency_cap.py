"""Self-consistency samples cut at the greedy call's length + 16 tokens: does any agreement change?

The same samples (one seed, the full budget of ``llm.max_new_tokens``) are scored uncut and cut, so
only a sample that agrees with the greedy call yet runs over the cap could change a value. Prints each
call's greedy length, how far its batch of samples ran, both agreements, and how much longer than the
greedy call the agreeing samples were.

    python benchmarks/consistency_cap.py smollm2_135m 12
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from mice_exp.compose import as_plain, compose_config
from mice_exp.llm.capture import generate_ids
from mice_exp.llm.generation import truncate
from mice_exp.llm.backends import load_llm
from mice_exp.llm.prompt import PromptBuilder
from mice_exp.llm.settings import LLMSettings, PromptSettings
from mice_exp.llm.records import read_records_file
from mice_exp.llm.prefix_sources import prefill
from mice_exp.llm.sources import Prompts, agreement
from mice_exp.paths import paths_from
from mice_exp.pipeline import Pipeline


def main(llm_name: str, n: int) -> None:
    cfg = as_plain(compose_config([f"llm={llm_name}", "+experiment=action_belief"]))
    settings, budget = cfg["sources"]["consistency"], int(cfg["llm"]["max_new_tokens"])
    paths = paths_from(cfg["paths"])
    stage = read_records_file(paths.root / "experiments" / "records" / f"ste-{llm_name}.jsonl.gz", "ste")
    llm_stage = Pipeline.from_config(cfg).stage
    examples = {e.id: e for e in llm_stage.selection.examples}
    demos = llm_stage.demos(Path(tempfile.mkdtemp()))
    llm = load_llm(LLMSettings.from_config(cfg["llm"]), paths.models)
    builder = PromptBuilder.from_config(PromptSettings.from_config(cfg["prompt"]), llm.tokenizer)
    fmt = builder.fmt
    torch.manual_seed(int(settings["seed"]))
    tests = [r for r in stage.records if r["split"] == "test"]
    changed, longer, start = 0, [], time.time()
    for record in tests[:: max(1, len(tests) // n)][:n]:
        kept = [examples[d] for d in demos[record["id"]][:record["n_demos"]]]
        prompt = Prompts(builder, examples[record["id"]], kept, record).original
        cache = prefill(llm, prompt[:-1])
        cache.batch_repeat_interleave(int(settings["samples"]))
        out = generate_ids(llm, [prompt] * int(settings["samples"]), budget, cache=cache, fmt=fmt, do_sample=True,
                           temperature=float(settings["temperature"]), top_k=0, top_p=1.0)
        cap = len(record["token_ids"]) + int(settings["extra_tokens"])
        full = [truncate(llm.tokenizer, row.tolist(), llm.eos_ids(), fmt) for row in out]
        cut = [fmt.parse(truncate(llm.tokenizer, row[:cap].tolist(), llm.eos_ids(), fmt)[2]) for row in out]
        calls = [fmt.parse(text) for _, _, text in full]
        uncut_value, cut_value = agreement(calls, record), agreement(cut, record)
        changed += uncut_value != cut_value
        longer += [len(ids) - len(record["token_ids"]) for (ids, _, _), call in zip(full, calls)
                   if agreement([call], record) == 1.0]
        print(record["id"], len(record["token_ids"]), out.shape[1], f"{uncut_value:.1f} {cut_value:.1f}", flush=True)
    print(f"{n} calls, {changed} with a different agreement; agreeing samples' length - greedy length: "
          f"{sorted(set(longer))}; {time.time() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
