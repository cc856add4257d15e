"""Hidden states replayed from a records file against those the LLM stage captured while generating.

Takes the first N records of a published records file, replays each (rebuilt prompt + recorded tokens,
one teacher-forced forward, :func:`mice_exp.llm.teacher.replay_states`) and compares the pooled states
with the same calls' arrays in an LLM-stage cache folder of the same LLM (same order: a records file
keeps its stage's order). Prints the largest difference relative to each array's scale, the smallest
cosine between a replayed and a captured state, and the replay's time per call.

    python benchmarks/replay.py smollm2_135m .cache/llm/smollm2_135m-<key> 16
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from mice_exp.compose import as_plain, compose_config
from mice_exp.llm.backends import load_llm
from mice_exp.llm.prompt import PromptBuilder
from mice_exp.llm.settings import LLMSettings, PromptSettings
from mice_exp.llm.records import read_records_file, read_stage
from mice_exp.llm.teacher import replay_states
from mice_exp.llm.runner import shard_arrays
from mice_exp.llm.sources import record_prompts
from mice_exp.paths import paths_from
from mice_exp.pipeline import Pipeline


def main(llm_name: str, stage_folder: Path, n: int) -> None:
    cfg = as_plain(compose_config([f"llm={llm_name}"]))
    paths = paths_from(cfg["paths"])
    stage = read_records_file(paths.root / "experiments" / "records" / f"ste-{llm_name}.jsonl.gz", "ste")
    captured = read_stage(stage_folder)
    assert captured.ids[:n] == stage.ids[:n], "the stage cache and the records file list other calls"
    _, examples, demos = Pipeline.from_config(cfg).stage.context(stage)
    llm = load_llm(LLMSettings.from_config(cfg["llm"]), paths.models)
    builder = PromptBuilder.from_config(PromptSettings.from_config(cfg["prompt"]), llm.tokenizer)
    start = time.perf_counter()
    states = [replay_states(llm, record_prompts(builder, examples, demos, r).original, r["token_ids"])
              for r in stage.records[:n]]
    seconds = time.perf_counter() - start
    replayed = shard_arrays(states, store_tokens=False)
    for name, ours in replayed.items():
        theirs = captured.arrays(name)[:n]
        rel = np.abs(ours - theirs).max() / np.abs(theirs).max()
        a, b = ours.reshape(-1, ours.shape[-1]), theirs.reshape(-1, theirs.shape[-1])
        cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        print(f"{name}: max |replayed - captured| / max |captured| = {rel:.2e}; smallest cosine {cosine.min():.6f}")
    tokens = sum(r["prompt_tokens"] + len(r["token_ids"]) for r in stage.records[:n])
    print(f"{n} calls replayed in {seconds:.1f} s ({seconds / n:.2f} s / call, {tokens / n:.0f} tokens / call)")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 16)
