"""Prompt length under prompt=ste and prompt=json_tools: the same calls, the same demonstrations, one tokenizer.

Every prompt is built as the LLM stage builds it (each call's k demonstrations retrieved from the training
split, then each config's :class:`~mice_exp.llm.prompt.PromptBuilder`, dropping demonstrations past the
context window), with the LLM's tokenizer only: no weights are loaded, nothing is generated. Prints the mean,
median and largest prompt per config at k = ``prompt.k_demos`` (8) and zero-shot.

    python benchmarks/prompt_tokens.py                                    # BFCL live_simple, SmolLM2's tokenizer
    python benchmarks/prompt_tokens.py llm=gemma3_270m dataset=ste        # any Hydra overrides
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from mice_exp.compose import as_plain, compose_config
from mice_exp.llm.model import load_tokenizer
from mice_exp.llm.prompt import PromptBuilder
from mice_exp.llm.settings import PromptSettings
from mice_exp.paths import paths_from
from mice_exp.pipeline import Pipeline

DEFAULT = ["llm=smollm2_135m", "dataset=bfcl", "dataset.categories=[live_simple]"]
PROMPTS = ("ste", "json_tools")


def main(overrides: list[str]) -> None:
    cfgs = {name: as_plain(compose_config([*overrides, f"prompt={name}"])) for name in PROMPTS}
    cfg = cfgs[PROMPTS[0]]
    paths = paths_from(cfg["paths"])
    stage = Pipeline.from_config(cfg).stage
    selection = stage.selection
    examples = {e.id: e for e in selection.examples}
    demos = stage.demos(Path(tempfile.mkdtemp()))  # the same for both: retrieval reads no format
    tokenizer = load_tokenizer(cfg["llm"]["source"], paths.models)
    budget = stage.llm.prompt_budget
    k = int(cfg["prompt"]["k_demos"])
    print(f"{len(examples)} calls of {cfg['dataset']['name']} {cfg['dataset'].get('categories', '')}, "
          f"{cfg['llm']['display']}'s tokenizer, {budget}-token budget, prompt.demo_pool={cfg['prompt']['demo_pool']}")
    print(f"{'prompt':<12} {'k':>2} {'mean':>8} {'median':>7} {'max':>6} {'demos dropped':>14}")
    for shots in (k, 0):
        means = {}
        for name in PROMPTS:
            builder = PromptBuilder.from_config(PromptSettings.from_config(cfgs[name]["prompt"]), tokenizer)
            built = [builder.build(e, [examples[d] for d in demos[i][:shots]], budget) for i, e in examples.items()]
            lengths = np.array([len(p.ids) for p in built])
            means[name] = lengths.mean()
            tools = "tools= in the chat template" if builder.native else "tools in the system turn"
            print(f"{name:<12} {shots:>2} {lengths.mean():8.1f} {np.median(lengths):7.0f} {lengths.max():6d} "
                  f"{sum(p.dropped for p in built):>14}" + (f"   ({tools})" if builder.schemas else ""))
        print(f"{'':<12} {shots:>2} json_tools / ste = {means['json_tools'] / means['ste']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
