"""What a backend's generation of one call gives the LLM stage, and the cut every backend applies to its ids.

Torch-free: the backends' modules, the server's answers and the sources' replies read it without loading a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mice_exp.llm.toolcall import REACT, CallFormat


@dataclass
class Generation:
    """One truncated generation y with what was captured for each of its T tokens."""

    token_ids: list[int]
    token_probs: np.ndarray  # [T] probability of each chosen token (raw logits)
    text: str
    offsets: list[tuple[int, int]]  # [T] character span of each token in ``text``
    lens_ids: np.ndarray  # [L-1, T] logit-lens argmax of layers 1..L-1
    states: np.ndarray  # [max(T,1), L, d] layers 1..L (pre-norm) at the positions predicting y_t


def no_lens(n: int) -> np.ndarray:
    """``lens_ids`` of a generation of ``n`` tokens whose layers nobody read ([0, T]): an endpoint's, or a
    teacher-forced pass whose gate reads no layer strings."""
    return np.zeros((0, n), dtype=np.int32)


def no_states(n: int) -> np.ndarray:
    """``states`` of a generation of ``n`` tokens kept without hidden states ([max(T,1), 0, 0])."""
    return np.zeros((max(n, 1), 0, 0), np.float32)


def truncate(tokenizer, ids: Sequence[int], eos_ids: Sequence[int],
             fmt: CallFormat = REACT) -> tuple[list[int], list[tuple[int, int]], str]:
    """Cut ids at EOS (excluded) and at the call's stop in the reply format ``fmt``; return kept ids, their
    char offsets, the text."""
    ids = list(ids)
    for i, token in enumerate(ids):
        if token in eos_ids:
            ids = ids[:i]
            break
    offsets, full = token_spans(tokenizer, ids)
    stop = fmt.stop_offset(full)
    if stop is None:
        return ids, offsets, full
    keep = next((n for n, (_, end) in enumerate(offsets, 1) if end >= stop), len(ids))
    return ids[:keep], offsets[:keep], tokenizer.decode(ids[:keep], skip_special_tokens=True,
                                                        clean_up_tokenization_spaces=False)


def token_spans(tokenizer, ids: Sequence[int]) -> tuple[list[tuple[int, int]], str]:
    """Each token's character span in the text the ids decode to, and that text (a span ends where the
    decoded prefix ending with the token ends, so a token that completes a multi-byte character holds it)."""
    ends = [len(tokenizer.decode(ids[:n], skip_special_tokens=True, clean_up_tokenization_spaces=False))
            for n in range(1, len(ids) + 1)]
    return list(zip([0] + ends[:-1], ends)), tokenizer.decode(ids, skip_special_tokens=True,
                                                             clean_up_tokenization_spaces=False)
