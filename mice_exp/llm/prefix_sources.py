"""The confidence sources' runner on a transformers model (``hf``, and ``vllm``'s lens model): each call's source
prompts begin with the same tokens (the instructions, the demonstrations and the query: ~98% of an 8-shot prompt),
so their shared prefix is encoded once and every prompt continues from a copy of that cache (a sliding-window
layer cannot be cropped back); the prefill is most of the cost. What each source asks and how its value follows
is :mod:`mice_exp.llm.sources`'.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from transformers import DynamicCache

from mice_exp.llm.capture import generate_ids
from mice_exp.llm.model import LLM
from mice_exp.llm.prompt import option_token_ids
from mice_exp.llm.toolcall import CallFormat


def shared_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token to feed."""
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for i in range(n):
        if any(p[i] != first[i] for p in prompts[1:]):
            return i
    return n


@torch.inference_mode()
def prefill(llm: LLM, ids: Sequence[int]) -> DynamicCache:
    cache = DynamicCache(config=llm.model.config)
    if ids:
        llm.model(input_ids=torch.tensor([list(ids)], device=llm.device), **{llm.cache_arg: cache}, use_cache=True,
                  logits_to_keep=1)
    return cache


@torch.inference_mode()
def p_true(llm: LLM, cache: DynamicCache, start: int, prompt: Sequence[int]) -> float:
    out = llm.model(input_ids=torch.tensor([list(prompt[start:])], device=llm.device), **{llm.cache_arg: cache},
                    use_cache=True, logits_to_keep=1)
    probs = torch.softmax(out.logits[0, -1].float(), -1)
    yes, no = probs[option_token_ids(llm.tokenizer, "A")].sum(), probs[option_token_ids(llm.tokenizer, "B")].sum()
    return float(yes / (yes + no))


class PrefixCall:
    """One call's source prompts on a transformers model: the prefix they share is encoded once, and each
    prompt continues from that cache (a copy of it, but for the last prompt, which takes it)."""

    def __init__(self, llm: LLM, prompts: Sequence[Sequence[int]]):
        self.llm, self.left = llm, len(prompts)
        self.start = shared_length(prompts)
        self.shared = prefill(llm, prompts[0][:self.start])

    def _cache(self) -> DynamicCache:
        self.left -= 1
        return self.shared if self.left == 0 else copy.deepcopy(self.shared)

    def p_true(self, prompt: Sequence[int]) -> float:
        return p_true(self.llm, self._cache(), self.start, prompt)

    @torch.inference_mode()
    def greedy(self, prompt: Sequence[int], max_new_tokens: int, fmt: CallFormat) -> list[int]:
        return generate_ids(self.llm, [prompt], max_new_tokens, cache=self._cache(), fmt=fmt)[0].tolist()

    @torch.inference_mode()
    def samples(self, prompt: Sequence[int], k: int, temperature: float, max_new_tokens: int,
                fmt: CallFormat) -> list[list[int]]:
        """``k`` continuations of the prompt from one cache repeated in place."""
        cache = self._cache()
        cache.batch_repeat_interleave(k)
        out = generate_ids(self.llm, [prompt] * k, max_new_tokens, cache=cache, fmt=fmt, do_sample=True,
                           temperature=temperature, top_k=0, top_p=1.0)
        return [row.tolist() for row in out]


class PrefixSources:
    """The sources from a transformers model's own forward passes, one call at a time (:class:`PrefixCall`);
    samples seeded per batch from torch's global generator."""

    def __init__(self, llm: LLM):
        self.llm, self.tokenizer, self.eos = llm, llm.tokenizer, llm.eos_ids()

    def start_batch(self, seed: int) -> None:
        torch.manual_seed(seed)

    def call(self, prompts: Sequence[Sequence[int]]) -> PrefixCall:
        return PrefixCall(self.llm, prompts)
