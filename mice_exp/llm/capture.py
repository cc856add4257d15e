"""Greedy batched generation that captures every layer in the same forward passes.

Hooks on the decoder layers keep, at every step, each layer's hidden state at the last
position (the one that predicts the next token); a hook on the model keeps the raw
logits' log-softmax for one step, so the chosen token's probability comes from the raw
logits, not from processed scores. Nothing runs a second forward over the sequence.
After generation the ids are truncated at the stop, and the logit lens of all layers
i < L over all kept positions of the batch is one (row-chunked) GEMM.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache, GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.cache_utils import DynamicLayer

from mice_exp.llm.generation import Generation, truncate
from mice_exp.llm.model import LLM
from mice_exp.llm.toolcall import REACT, CallFormat

LENS_ROWS = 1024  # rows per lens GEMM chunk: bounds the (rows x |V|) logits buffer


class _ReservedLayer(DynamicLayer):
    """A growing cache layer whose keys and values live in a buffer reserved for the whole generation.

    DynamicLayer concatenates, so every decode step copies the layer's whole cache (on an 8 x 1,000-token
    batch, ~370 MB per step over SmolLM2's 30 layers). Here the new states are written in place and
    attention gets a view of the filled part: the same values, in the same shape, so the same tokens.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        batch, heads, _, _ = key_states.shape
        self._keys = key_states.new_empty(batch, heads, self.capacity, key_states.shape[-1])
        self._values = value_states.new_empty(batch, value_states.shape[1], self.capacity, value_states.shape[-1])
        self._length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"cache reserved for {self.capacity} positions, asked for {end}")
        self._keys[:, :, self._length:end] = key_states
        self._values[:, :, self._length:end] = value_states
        self._length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values


def reserved_cache(llm: LLM, capacity: int) -> DynamicCache:
    """A DynamicCache whose full-attention layers reserve ``capacity`` positions up front (sliding-window
    layers, e.g. Gemma's local ones, keep their own rolling buffer)."""
    cache = DynamicCache(config=llm.model.config)
    cache.layers = [_ReservedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


class _StopAtCall(StoppingCriteria):
    """Stops a sequence once its text holds a complete call in the reply format (:meth:`CallFormat.stop_offset`:
    STE's, a complete Action Input JSON or "Observation")."""

    def __init__(self, tokenizer, prompt_len: int, batch: int, fmt: CallFormat):
        self.tokenizer = tokenizer
        self.prompt_len = prompt_len
        self.done = [False] * batch
        self.fmt = fmt

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        for b, finished in enumerate(self.done):
            if not finished:
                text = self.tokenizer.decode(input_ids[b, self.prompt_len:], skip_special_tokens=True)
                self.done[b] = self.fmt.stop_offset(text) is not None
        return torch.tensor(self.done, device=input_ids.device)


class _Recorder:
    """Forward hooks that record per-step last-position states and chosen-token log-probs."""

    def __init__(self, n_layers: int):
        self.current: list[torch.Tensor | None] = [None] * n_layers
        self.steps: list[torch.Tensor] = []
        self.token_logp: list[torch.Tensor] = []
        self.prev_logp: torch.Tensor | None = None

    def keep_layer(self, index: int, hidden: torch.Tensor) -> None:
        # A copy, not a view: a view of the last position pins the layer's whole [B, T, d] output until
        # the next step, 30 x 110 MB for SmolLM2's prefill of 8 x 6,000 tokens (measured: 3.98 -> 3.07
        # GiB peak at 8 x 2,000). The values are the same.
        self.current[index] = hidden[:, -1, :].clone()

    def model_hook(self, module, args, kwargs, output):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if self.prev_logp is not None:
            self.token_logp.append(self.prev_logp.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev_logp = torch.log_softmax(output.logits[:, -1, :].float(), dim=-1)
        self.steps.append(torch.stack(self.current, dim=1))  # [B, L, d]

    def finish(self, last_tokens: torch.Tensor) -> None:
        self.token_logp.append(self.prev_logp.gather(1, last_tokens[:, None]).squeeze(1))


@contextmanager
def layer_states(llm: LLM, keep: Callable[[int, torch.Tensor], None]) -> Iterator[None]:
    """While open, every decoder layer's forward calls ``keep(layer index, its hidden states [B, T, d])``
    (a layer returns a tensor or a tuple starting with one, depending on the model)."""
    def hook(index: int):
        def call(module, args, output):
            keep(index, output[0] if isinstance(output, tuple) else output)
        return call

    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(llm.layers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _hooks(llm: LLM, recorder: _Recorder) -> Iterator[None]:
    handle = llm.model.register_forward_hook(recorder.model_hook, with_kwargs=True)
    try:
        with layer_states(llm, recorder.keep_layer):
            yield
    finally:
        handle.remove()


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


def generate_ids(llm: LLM, prompts: Sequence[Sequence[int]], max_new_tokens: int, cache: Any = None,
                 fmt: CallFormat = REACT, **sampling) -> torch.Tensor:
    """Generated ids (prompt removed) under the stopping rule of the reply format ``fmt``; greedy unless
    ``sampling`` says otherwise.

    A fresh GenerationConfig keeps the model's own defaults (temperature, top-k, penalties) out.
    ``cache``, a cache of a prefix of every prompt, skips re-encoding that prefix.
    """
    ids, mask = _left_pad(prompts, llm.tokenizer.pad_token_id, llm.device)
    config = GenerationConfig(**({"do_sample": False} | sampling), max_new_tokens=max_new_tokens, num_beams=1,
                              pad_token_id=llm.tokenizer.pad_token_id, eos_token_id=llm.eos_ids())
    rows = len(prompts) * int(sampling.get("num_return_sequences", 1))
    stop = StoppingCriteriaList([_StopAtCall(llm.tokenizer, ids.shape[1], rows, fmt)])
    with attention_kernels(llm.device):
        out = llm.model.generate(input_ids=ids, attention_mask=mask, generation_config=config, stopping_criteria=stop,
                                 **{llm.cache_arg: cache})
    return out[:, ids.shape[1]:]


#: Attention kernels on a GPU: all but cuDNN's. Torch picks cuDNN's on an H100, which builds a graph for every new
#: (batch, length, stride) shape; a stage meets new shapes at every decode step of every batch, so its first pass
#: costs twice the warm one (random Llama-3.1-8B-shaped, bf16, 45 STE calls: 44.4 s vs 17.6 s without cuDNN's,
#: docs/measured.md), and the capture's cache views even changed 5 of 45 greedy calls against plain generation.
GPU_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_kernels(device: torch.device) -> Any:
    """The attention kernels generation may use on ``device`` (:data:`GPU_ATTENTION`; the CPU's as ever)."""
    return sdpa_kernel(GPU_ATTENTION) if device.type == "cuda" else nullcontext()


@torch.inference_mode()
def lens_argmax(llm: LLM, states: torch.Tensor) -> torch.Tensor:
    """Argmax token of the logit lens for rows of hidden states [N, d], in row chunks."""
    out = torch.empty(states.shape[0], dtype=torch.long, device=states.device)
    for lo in range(0, states.shape[0], LENS_ROWS):
        out[lo:lo + LENS_ROWS] = llm.lens_argmax(states[lo:lo + LENS_ROWS])
    return out


@torch.inference_mode()
def generate_plain(llm: LLM, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   fmt: CallFormat = REACT) -> torch.Tensor:
    """Plain greedy generation with the same stopping rule (the speed baseline)."""
    return generate_ids(llm, prompts, max_new_tokens, fmt=fmt)


@torch.inference_mode()
def generate_batch(llm: LLM, prompts: Sequence[Sequence[int]], max_new_tokens: int, fmt: CallFormat = REACT,
                   reserve: bool = True) -> list[Generation]:
    """Greedy generation of a batch with single-pass capture of every layer, stopping after the first
    complete call in the reply format ``fmt``."""
    recorder = _Recorder(llm.n_layers)
    cache = reserved_cache(llm, max(len(p) for p in prompts) + max_new_tokens) if reserve else None
    with _hooks(llm, recorder):
        generated = generate_ids(llm, prompts, max_new_tokens, cache=cache, fmt=fmt)
    recorder.finish(generated[:, -1])
    steps = torch.stack(recorder.steps[: generated.shape[1]], dim=1)  # [B, S, L, d]
    probs = torch.stack(recorder.token_logp[: generated.shape[1]], dim=1).exp()  # [B, S]
    kept = [truncate(llm.tokenizer, row.tolist(), llm.eos_ids(), fmt) for row in generated]
    lengths = [len(ids) for ids, _, _ in kept]
    n_lens = llm.n_layers - 1
    rows = torch.cat([steps[b, :n, :n_lens].reshape(-1, steps.shape[-1]) for b, n in enumerate(lengths)])
    lens = lens_argmax(llm, rows).cpu().numpy() if len(rows) else np.zeros(0, dtype=np.int64)
    results, cursor = [], 0
    for b, (ids, offsets, text) in enumerate(kept):
        n = lengths[b]
        block = lens[cursor:cursor + n * n_lens].reshape(n, n_lens).T.astype(np.int32)
        cursor += n * n_lens
        results.append(Generation(
            token_ids=ids, token_probs=probs[b, :n].cpu().numpy().astype(np.float64), text=text,
            offsets=offsets, lens_ids=block, states=steps[b, : max(n, 1)].float().cpu().numpy(),
        ))
    return results


@dataclass
class CapturingLLM(LLM):
    """The ``hf`` backend's generator: the loaded model, generating with single-pass capture."""

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, fmt: CallFormat) -> list[Generation]:
        return generate_batch(self, prompts, max_new_tokens, fmt)
