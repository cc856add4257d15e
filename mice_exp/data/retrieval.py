"""Pick in-context demonstrations by SentenceBERT similarity of queries, as STE and MICE do.

The encoder reproduces sentence-transformers' all-MiniLM-L6-v2 pipeline (its
``modules.json``: Transformer, mean pooling, Normalize) with plain transformers, so
sentence-transformers is not a dependency.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from mice_exp.data.records import Example, demo_declines
from mice_exp.devices import resolve_device
from mice_exp.errors import UserError
from mice_exp.loading import load_checked
from mice_exp.packages import default_model_path

# all-MiniLM-L6-v2's sentence_bert_config.json: longer inputs are truncated.
MAX_SEQ_LENGTH = 256


class SentenceEncoder:
    """Unit-length sentence embeddings: mean of token states over the attention mask."""

    def __init__(self, model_path: str | Path | None = None, device: str = "cpu", batch_size: int = 64) -> None:
        """Load tokenizer and model from a local folder or a hub id (None: the installed MiniLM)."""
        source = os.path.expanduser(str(model_path if model_path is not None else default_model_path()))
        if source.startswith(("/", ".")) and not Path(source).is_dir():
            raise UserError(f"sentence encoder path {source!r} is not a folder; expected a model folder or a hub id")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(source)
            self.model = load_checked(AutoModel, source, "retrieval.model").to(
                resolve_device(device, "retrieval.device")).eval()
        except OSError as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UserError(
                f"cannot load the sentence encoder {source!r} ({reason}); expected a local model folder "
                "or a Hugging Face hub id reachable from here"
            ) from error
        self.device = self.model.device
        self.batch_size = batch_size

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of ``texts`` as a float32 array of shape (len(texts), dim), rows of norm 1."""
        chunks = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    list(texts[start : start + self.batch_size]),
                    padding=True,
                    truncation=True,
                    max_length=MAX_SEQ_LENGTH,
                    return_tensors="pt",
                ).to(self.device)
                states = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
                mean = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                chunks.append(torch.nn.functional.normalize(mean, p=2, dim=1).float().cpu().numpy())
        dim = self.model.config.hidden_size
        return np.concatenate(chunks) if chunks else np.zeros((0, dim), dtype=np.float32)


class PoolEncoder:
    """A :class:`SentenceEncoder` that keeps the vectors of a fixed pool of texts: a gate retrieves from the same
    demonstration pool for every query, so the pool is encoded once, not once per query."""

    def __init__(self, encoder: SentenceEncoder, pool: Sequence[str]) -> None:
        self.encoder = encoder
        texts = list(dict.fromkeys(pool))
        self._kept = dict(zip(texts, encoder.encode(texts)))

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        fresh = [t for t in dict.fromkeys(texts) if t not in self._kept]
        rows = self._kept | dict(zip(fresh, self.encoder.encode(fresh)))
        return np.stack([rows[t] for t in texts]) if texts else self.encoder.encode([])


#: ``prompt.demo_mix``: the k most similar pool examples; as many declining (no tool fits: BFCL's
#: irrelevance replies) as calling ones among the most similar of each, so that the demonstrations do not
#: answer "should a tool be called?" for the query (its nearest neighbours share its category); or only
#: calling ones, so that declining has to come from the instructions and the tools alone.
DEMO_MIXES = ("similar", "balanced", "calling")
#: declining / calling demonstrations each mix shows out of k (``similar``: no quota)
MIX_QUOTAS = {"balanced": lambda k: {True: k // 2, False: k - k // 2}, "calling": lambda k: {True: 0, False: k}}


def declines(example: Example) -> bool:
    """Whether the example's demonstration makes no call (BFCL's irrelevance replies): read from the demonstration
    itself, so a gate's saved pool tells it as the run's examples do."""
    return demo_declines(example.demo)


def rank_demos(
    examples: Sequence[Example], k: int, encoder: SentenceEncoder | PoolEncoder, pool: Sequence[Example] | None = None,
    mix: str = "similar",
) -> dict[str, list[str]]:
    """For each example, the ids of the ``k`` pool examples with the most similar queries.

    The pool defaults to ``examples`` and never contributes the example itself (same
    id). Most similar first by cosine similarity; equal similarities go to the smaller
    id. Each distinct query text is encoded once, so equal texts tie exactly. ``mix="balanced"``:
    the k // 2 most similar declining pool examples and the k - k // 2 most similar others, in the
    same order; ``mix="calling"``: the k most similar pool examples that call a tool.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise UserError(f"number of demonstrations k={k!r}: expected a positive integer")
    if mix not in DEMO_MIXES:
        raise UserError(f"prompt.demo_mix={mix!r}; expected one of {', '.join(DEMO_MIXES)}")
    candidates = sorted(examples if pool is None else pool, key=lambda e: e.id)
    texts = list(dict.fromkeys([e.query for e in examples] + [e.query for e in candidates]))
    row_of = {text: row for row, text in enumerate(texts)}
    vectors = encoder.encode(texts)
    similarity = vectors @ vectors[[row_of[e.query] for e in candidates]].T
    ids = [e.id for e in candidates]
    quota = MIX_QUOTAS[mix](k) if mix in MIX_QUOTAS else None
    side = [declines(e) for e in candidates]
    if quota is not None and (sum(side) < quota[True] or len(side) - sum(side) < quota[False]):
        raise UserError(f"prompt.demo_mix={mix} with k={k} needs {quota[True]} declining and {quota[False]} "
                        f"calling pool examples; the pool has {sum(side)} and {len(side) - sum(side)}")
    ranking = {}
    for example in examples:
        order = np.argsort(-similarity[row_of[example.query]], kind="stable")  # stable: ties keep id order
        if quota is None:
            chosen = [ids[i] for i in order[: k + 1] if ids[i] != example.id][:k]  # self is at most one
        else:
            left, chosen = dict(quota), []
            for i in order:
                if ids[i] != example.id and left[side[i]]:
                    left[side[i]] -= 1
                    chosen.append(ids[i])
        if len(chosen) < k:
            raise UserError(f"k={k} demonstrations requested but only {len(chosen)} other examples are in the pool")
        ranking[example.id] = chosen
    return ranking
