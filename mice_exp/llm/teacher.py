"""Given replies teacher-forced after their prompts: one forward pass, no decoding loop.

What a records file's hidden states are replayed with (:mod:`mice_exp.llm.replay`), another LLM's calls judged
with and a proposed call scored with (:meth:`mice_exp.gate.Gate.score`): every layer at the positions that predict
each reply token, as the LLM stage captures them in its generating pass, up to float rounding. This is the
transformers model's teacher (``hf``); an engine brings its own (:meth:`mice_exp.llm.backends.Backend.teacher`).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from mice_exp.llm.capture import layer_states, lens_argmax
from mice_exp.llm.generation import Generation, no_lens, no_states, token_spans
from mice_exp.llm.model import LLM


def _forward(llm: LLM, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]],
             logits: bool, capture: bool = True) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """One teacher-forced forward over a batch of prompt + reply: per row, with ``capture``, every layer at the
    positions that predict each reply token ([max(T,1), L, d], an empty reply keeping the prompt's last position)
    and, with ``logits``, each reply token's log-probability under the raw logits ([T]). Rows are left-padded as
    generation pads them (positions counted from each row's first token), so every row's reply ends at the
    last position and only the last max(T) positions' logits are computed; a lone row is not padded."""
    counts = [max(len(r), 1) for r in replies]
    rows = [list(p) + list(r[:n - 1]) for p, r, n in zip(prompts, replies, counts)]
    width, tail = max(len(r) for r in rows), max(counts)
    extra = {}
    ids = torch.tensor([rows[0]], dtype=torch.long)
    if len(rows) > 1:
        ids = torch.full((len(rows), width), llm.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, width - len(row):], mask[b, width - len(row):] = torch.tensor(row, dtype=torch.long), 1
        extra = {"attention_mask": mask.to(llm.device),
                 "position_ids": (mask.cumsum(1) - 1).clamp(min=0).to(llm.device)}
    captured: list[torch.Tensor | None] = [None] * llm.n_layers

    def keep(index: int, hidden: torch.Tensor) -> None:
        captured[index] = hidden[:, -tail:].to(torch.float32, copy=True)  # not a view pinning [B, S, d]

    with layer_states(llm, keep) if capture else contextlib.nullcontext():
        out = llm.model(input_ids=ids.to(llm.device), use_cache=False, logits_to_keep=tail if logits else 1, **extra)
    states: list[torch.Tensor | None] = [None] * len(rows)
    if capture:
        layers = torch.stack(captured, dim=2)  # [B, tail, L, d]
        states = [layers[b, tail - n:] for b, n in enumerate(counts)]
    if not logits:
        return states, [None] * len(rows)
    logp = []
    for b, reply in enumerate(replies):
        scores = torch.log_softmax(out.logits[b, tail - len(reply):].float(), dim=-1)
        logp.append(scores.gather(1, torch.tensor(list(reply), dtype=torch.long, device=scores.device)[:, None])[:, 0])
    return states, logp


@torch.inference_mode()
def replay_states(llm: LLM, prompt: Sequence[int], generated: Sequence[int]) -> np.ndarray:
    """[max(T,1), L, d]: every layer's output (pre-norm) at the positions that predicted each of the T
    generated tokens, as :func:`mice_exp.llm.capture.generate_batch` records them (an empty generation
    keeps the prompt's last position)."""
    return _forward(llm, [prompt], [generated], logits=False)[0][0].cpu().numpy()


@torch.inference_mode()
def score_replies(llm: LLM, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], *,
                  lens: bool = True, states: bool = True) -> list[Generation]:
    """Each reply's tokens (:func:`~mice_exp.llm.runner.reply_tokens`) teacher-forced after its prompt in one
    forward pass per batch: the :class:`~mice_exp.llm.capture.Generation` that generating it would have captured (its
    tokens' probabilities under the raw logits, every layer's state and the logit lens of layers 1..L-1 at the
    positions predicting each token), up to float rounding, with no decoding loop. What scoring a call that
    someone else proposed (:meth:`mice_exp.gate.Gate.score`) and judging another LLM's records
    (:func:`judge_records`) run on. Without ``lens`` / ``states`` (what a gate whose view reads neither asks) the
    generations hold none (as an endpoint's do), and with neither no layer is captured: the pass is the plain
    forward with the reply's logits."""
    ids = [list(r) for r in replies]
    capture = lens or states
    if llm.device.type == "cpu":  # rows one at a time: a CPU's prefill is compute-bound, so a padded batch gains
        kept, logp = [], []       # nothing and pays its padding and mask (8 STE calls: 0.84x the throughput)
        for prompt, reply in zip(prompts, ids):
            (state,), (lp,) = _forward(llm, [prompt], [reply], logits=True, capture=capture)
            kept.append(state), logp.append(lp)
    else:
        kept, logp = _forward(llm, prompts, ids, logits=True, capture=capture)
    return as_generations(llm, ids, kept, logp, lens=lens, states=states)


@torch.inference_mode()
def score_shared(llm: LLM, prompt: Sequence[int], replies: Sequence[Sequence[int]], *, lens: bool = True,
                 states: bool = True, rows: int = 8) -> list[Generation]:
    """:func:`score_replies` for many replies to ONE prompt (K agents' calls on the same query): the prompt's
    prefill runs once into a KV cache, then the replies go through in forwards of ``rows`` rows each, right-padded
    after the cached prefix (a pad only follows a row's tokens, so causal attention never lets a real position see
    one). K replies cost one prefill plus K short passes, where :func:`score_replies` pays K prefills; the
    generations equal it up to float rounding (the attention's sums split at the cache)."""
    ids = [list(r) for r in replies]
    if not ids:
        return []
    capture = lens or states
    prefix = torch.tensor([list(prompt[:-1])], dtype=torch.long, device=llm.device)
    base = None
    if len(prompt) > 1:
        base = DynamicCache(config=llm.model.config)
        llm.model(input_ids=prefix, use_cache=True, logits_to_keep=1, **{llm.cache_arg: base})
    kept: list[torch.Tensor | None] = []
    logp: list[torch.Tensor] = []
    for lo in range(0, len(ids), rows):
        chunk = ids[lo:lo + rows]
        counts = [max(len(r), 1) for r in chunk]
        width = max(counts)
        batch = torch.full((len(chunk), width), llm.tokenizer.pad_token_id or 0, dtype=torch.long)
        for b, (reply, n) in enumerate(zip(chunk, counts)):
            batch[b, :n] = torch.tensor([prompt[-1], *reply[:n - 1]], dtype=torch.long)
        cache = None
        if base is not None:
            cache = copy.deepcopy(base)
            cache.batch_repeat_interleave(len(chunk))
        start = len(prompt) - 1
        positions = torch.arange(start, start + width, device=llm.device)[None].expand(len(chunk), -1)
        captured: list[torch.Tensor | None] = [None] * llm.n_layers

        def keep(index: int, hidden: torch.Tensor) -> None:
            captured[index] = hidden.to(torch.float32, copy=True)

        with layer_states(llm, keep) if capture else contextlib.nullcontext():
            out = llm.model(input_ids=batch.to(llm.device), position_ids=positions, use_cache=cache is not None,
                            logits_to_keep=width, **{llm.cache_arg: cache})
        layers = torch.stack(captured, dim=2) if capture else None  # [B, width, L, d]
        for b, (reply, n) in enumerate(zip(chunk, counts)):
            kept.append(layers[b, :n] if layers is not None else None)
            scores = torch.log_softmax(out.logits[b, :len(reply)].float(), dim=-1)
            logp.append(scores.gather(1, torch.tensor(reply, dtype=torch.long, device=scores.device)[:, None])[:, 0])
    return as_generations(llm, ids, kept, logp, lens=lens, states=states, one_prompt=True)


def as_generations(llm: LLM, ids: Sequence[list[int]], layers: Sequence[torch.Tensor | None],
                   logp: Sequence[torch.Tensor], *, lens: bool = True, states: bool = True,
                   one_prompt: bool = False) -> list[Generation]:
    """Teacher-forced replies as the :class:`~mice_exp.llm.capture.Generation` generating them would have captured,
    from every layer's states at the positions predicting each token ([max(T,1), L, d]) and each token's
    log-probability ([T]): the logit lens of layers 1..L-1 through ``llm``'s final norm and unembedding. Without
    ``lens`` or ``states`` the generations hold no lens tokens ([0, T]) or no states ([max(T,1), 0, 0]).
    ``one_prompt``: every reply follows the same prompt, so positions after the same reply tokens hold the same
    states, and the lens, a vocabulary-wide GEMM per layer (most of a short reply's cost on a 262k-word Gemma),
    reads each such position once (K calls to one API share their ``Action: NAME`` and first keys)."""
    tokenizer, n_lens = llm.tokenizer, llm.n_layers - 1
    read = _lens_tokens(llm, ids, layers, n_lens, one_prompt) if lens else None
    out, cursor = [], 0
    for reply, state, lp in zip(ids, layers, logp):
        offsets, text = token_spans(tokenizer, reply)
        block = no_lens(len(reply))
        if read is not None:
            block = read[cursor:cursor + len(reply)].T.cpu().numpy().astype(np.int32)
            cursor += len(reply)
        out.append(Generation(token_ids=reply, token_probs=lp.exp().cpu().numpy().astype(np.float64), text=text,
                              offsets=offsets, lens_ids=block,
                              states=state.cpu().numpy() if states and state is not None else no_states(len(reply))))
    return out


def _lens_tokens(llm: LLM, ids: Sequence[list[int]], layers: Sequence[torch.Tensor], n_lens: int,
                 one_prompt: bool) -> torch.Tensor:
    """[sum T, L-1]: the lens token of layers 1..L-1 at each reply position, in reply order; with ``one_prompt``
    each distinct reply prefix computed once."""
    if not one_prompt:
        rows = torch.cat([s[:len(r), :n_lens] for s, r in zip(layers, ids)])
        return lens_argmax(llm, rows.reshape(-1, rows.shape[-1])).reshape(len(rows), n_lens)
    first: dict[tuple[int, ...], int] = {}
    kept, where = [], []
    for state, reply in zip(layers, ids):
        for t in range(len(reply)):
            key = tuple(reply[:t])  # the position predicting token t has read the prompt and reply[:t]
            if key not in first:
                first[key] = len(kept)
                kept.append(state[t, :n_lens])
            where.append(first[key])
    if not kept:
        return torch.zeros((0, n_lens), dtype=torch.long)
    rows = torch.stack(kept)
    unique = lens_argmax(llm, rows.reshape(-1, rows.shape[-1])).reshape(len(kept), n_lens)
    return unique[torch.tensor(where, dtype=torch.long, device=unique.device)]


class Teacher:
    """Given replies teacher-forced after their prompts on a transformers model (``hf``; what every backend without
    an engine of its own replays on). ``states``: a records file's call, every layer at the positions the stage
    captured; ``score``: :func:`score_replies`."""

    def __init__(self, llm: LLM):
        self.llm, self.tokenizer = llm, llm.tokenizer
        self.n_layers, self.hidden_size, self.device = llm.n_layers, llm.hidden_size, llm.device.type

    def states(self, prompt: Sequence[int], generated: Sequence[int]) -> np.ndarray:
        return replay_states(self.llm, prompt, generated)

    def score(self, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], *, lens: bool = True,
              states: bool = True) -> list[Generation]:
        return score_replies(self.llm, prompts, replies, lens=lens, states=states)

    def score_shared(self, prompt: Sequence[int], replies: Sequence[Sequence[int]], *, lens: bool = True,
                     states: bool = True) -> list[Generation]:
        return score_shared(self.llm, prompt, replies, lens=lens, states=states)
