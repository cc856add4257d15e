"""``llm.backend=hf``: Hugging Face transformers, with every layer captured in the generating pass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from mice_exp.llm.capture import Generation, generate_batch
from mice_exp.llm.model import LLM, load_hf
from mice_exp.llm.toolcall import CallFormat


@dataclass
class HFBackend(LLM):
    """The loaded model (:class:`~mice_exp.llm.model.LLM`) that generates as the stage asks."""

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, fmt: CallFormat) -> list[Generation]:
        """Greedy generation with single-pass capture (:func:`mice_exp.llm.capture.generate_batch`)."""
        return generate_batch(self, prompts, max_new_tokens, fmt)


def load(cfg: Mapping[str, Any], models_cache: Path) -> HFBackend:
    llm = load_hf(cfg, models_cache)
    return HFBackend(model=llm.model, tokenizer=llm.tokenizer, name=llm.name, device=llm.device)
