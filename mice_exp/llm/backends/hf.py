"""``llm.backend=hf``: Hugging Face transformers, with every layer captured in the generating pass."""

from __future__ import annotations

from typing import Any

from mice_exp.llm.backends import Backend


class HF(Backend):
    """The model itself generates (:class:`~mice_exp.llm.capture.CapturingLLM`), replays states and computes the
    sources from its own forward passes."""

    name = "hf"

    def key(self) -> dict[str, Any]:
        """Nothing: every cache made before backends existed keeps its key."""
        return {}

    def load(self) -> Any:
        from mice_exp.llm.capture import CapturingLLM  # torch: only when the model loads
        from mice_exp.llm.model import load_hf  # loads torch

        llm = load_hf(self.settings, self.models)
        return CapturingLLM(model=llm.model, tokenizer=llm.tokenizer, name=llm.name, device=llm.device)

    def _own_forward_model(self) -> Any:
        return self.generator()


BACKEND = HF
