"""One path from examples to records for everything that puts tool calls through an LLM: the LLM stage
(:mod:`mice_exp.llm.stage`), the replay of a records file's states (:mod:`mice_exp.llm.replay`), the judge of other
agents' calls (:mod:`mice_exp.llm.judge`) and the gate (:mod:`mice_exp.gate`).

    examples --Retrieval.rank--> demonstrations --Runner.prompts--> prompts (the template; the least similar
    demonstrations dropped until the prompt fits the prompt budget) --Runner.batches--> fixed batches (prompt
    length, then key) --Runner.generate / Runner.force--> records and pooled arrays

A :class:`Runner` is built once per LLM (its tokenizer writes the prompts) from the ``prompt`` and ``llm``
settings and handed the calls, so that every caller prompts, batches (so pads, so rounds) and records alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Mapping, Sequence, TypeVar

import numpy as np
from tqdm.auto import tqdm

from mice_exp.cache import stable_hash
from mice_exp.data import Example
from mice_exp.data.labels import is_correct
from mice_exp.errors import UserError
from mice_exp.llm.prompt import Prompt, PromptBuilder
from mice_exp.llm.records import Record
from mice_exp.llm.settings import LLMSettings, PromptSettings, RetrievalSettings
from mice_exp.llm.toolcall import CallFormat, content_mask

if TYPE_CHECKING:  # annotations only
    from mice_exp.llm.generation import Generation

K = TypeVar("K")


def make_record(example: Example, split: str, prompt: Prompt, gen: Generation, lens_text: list[str],
                fmt: CallFormat) -> Record:
    """The record of one call: generation, parsed call (in the reply format ``fmt``), label, confidences,
    layer strings."""
    call = fmt.parse(gen.text)
    mask = content_mask(gen.offsets, fmt.spans(gen.text))
    probs = gen.token_probs
    used = probs[mask] if any(mask) else probs  # unparseable: every generated token counts
    return {
        "id": example.id, "api": example.api, "split": split, "dataset": example.dataset,
        "prompt_tokens": len(prompt.ids), "prompt_hash": stable_hash(prompt.ids), "n_demos": prompt.n_demos,
        "demos_dropped": prompt.dropped,
        "text": gen.text, "token_ids": gen.token_ids, "token_probs": probs.tolist(),
        "offsets": [list(o) for o in gen.offsets], "content_mask": mask,
        "raw_confidence": float(np.prod(used)) if len(used) else 1.0,
        "min_probability": float(np.min(used)) if len(used) else 1.0,
        "pred_api": call.api, "pred_args": call.args, "parse_error": call.parse_error,
        "label": int(is_correct(example, call.api, call.args)),
        "layer_strings": lens_text, "lens_ids": gen.lens_ids.tolist(),
    } | ({"conversation": example.conversation_id} if example.conversation is not None else {})


def shard_arrays(states: Sequence[np.ndarray], store_tokens: bool) -> dict[str, np.ndarray]:
    """Per-call pooled states [B, L, d] of a batch's per-token states [T, L, d] (and every token's when asked)."""
    arrays = {
        "mean_pool": np.stack([s.mean(axis=0) for s in states]).astype(np.float32),
        "last_token": np.stack([s[-1] for s in states]).astype(np.float32),
        "first_token": np.stack([s[0] for s in states]).astype(np.float32),
    }
    if store_tokens:
        arrays["token_states"] = np.concatenate(states).astype(np.float32)
        arrays["token_counts"] = np.array([len(s) for s in states], dtype=np.int64)
    return arrays


def batches(prompts: Mapping[K, Prompt], size: int) -> list[list[K]]:
    """Fixed batches by (prompt length, key): similar lengths pad little, and a resumed run, a
    re-run and the gate all batch (so pad, so round) exactly alike."""
    order = sorted(prompts, key=lambda i: (len(prompts[i].ids), i))
    return [order[lo:lo + size] for lo in range(0, len(order), size)]


def generate_batch(llm: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   fmt: CallFormat) -> list[Generation]:
    """The backend's greedy generation of a batch, stopping after the first call in the reply format ``fmt``,
    with capture where it has internals (``llm.backend``)."""
    return llm.generate(prompts, max_new_tokens, fmt)


def reply_tokens(tokenizer: Any, text: str) -> list[int]:
    """The tokens a given reply is teacher-forced as: its text as ``tokenizer`` splits it (a call rendered
    canonically, another agent's call), no special tokens."""
    return tokenizer.encode(text, add_special_tokens=False)


@dataclass(frozen=True)
class Retrieval:
    """How a prompt's demonstrations are chosen: the ``k`` pool examples whose queries are most similar
    (``prompt.k_demos``, ``prompt.demo_mix``) under the ``conf/retrieval`` sentence encoder."""

    k: int
    mix: str = "similar"
    model: Any = None  # a model folder or hub id (None: the installed MiniLM)
    device: str = "cpu"

    @classmethod
    def from_config(cls, prompt: PromptSettings, retrieval: RetrievalSettings) -> Retrieval:
        return cls(k=int(prompt.k_demos), mix=prompt.demo_mix, model=retrieval.model, device=retrieval.device)

    def encoder(self) -> Any:
        """The sentence encoder, loaded now (the stage's once per retrieval; the gate's once, holding its pool)."""
        from mice_exp.data.retrieval import SentenceEncoder  # loads torch, transformers

        return SentenceEncoder(self.model, device=self.device)

    def rank(self, examples: Iterable[Example], pool: Sequence[Example],
             encoder: Callable[[], Any]) -> dict[str, list[str]]:
        """Each example's demonstrations' ids, most similar first, from ``pool`` (zero-shot: none, and no
        ``encoder()`` is built)."""
        examples = list(examples)
        if not self.k:
            return {e.id: [] for e in examples}
        from mice_exp.data.retrieval import rank_demos  # loads torch, transformers

        return rank_demos(examples, self.k, encoder(), pool=pool, mix=self.mix)


@dataclass(frozen=True)
class Calls(Generic[K]):
    """What a runner puts through the LLM, by key (an example's id, a request's index): each call's example,
    split and prompt."""

    examples: Mapping[K, Example]
    splits: Mapping[K, str]
    prompts: Mapping[K, Prompt]

    def only(self, keys: Iterable[K]) -> Calls[K]:
        """The calls of ``keys`` alone (a gate's requests whose calls are scored)."""
        keys = list(keys)
        return Calls({k: self.examples[k] for k in keys}, {k: self.splits[k] for k in keys},
                     {k: self.prompts[k] for k in keys})


@dataclass(frozen=True)
class Batch(Generic[K]):
    """Calls put through the LLM: their keys, records and pooled arrays (in that order) and the seconds each
    part took (``generate_s``; teacher-forced: ``forward_s`` and ``records_s``)."""

    keys: list[K]
    records: list[Record]
    arrays: dict[str, np.ndarray]
    seconds: dict[str, float]

    @classmethod
    def joined(cls, parts: Sequence[Batch[K]]) -> Batch[K]:
        """Batches as one, in their order: arrays concatenated, seconds summed."""
        names = parts[0].arrays if parts else {}
        return cls(keys=[k for p in parts for k in p.keys], records=[r for p in parts for r in p.records],
                   arrays={name: np.concatenate([p.arrays[name] for p in parts]) for name in names},
                   seconds={s: sum(p.seconds[s] for p in parts) for s in (parts[0].seconds if parts else {})})


class Runner:
    """How one LLM's calls are prompted, batched and recorded: the prompt builder (``prompt`` settings, the LLM's
    tokenizer), the prompt budget, the batch size and the reply budget (``llm`` settings), derived once."""

    def __init__(self, builder: PromptBuilder, llm: LLMSettings, store_tokens: bool = False) -> None:
        self.builder, self.fmt = builder, builder.fmt
        self.budget = llm.prompt_budget
        self.window = int(llm.context_window)
        self.batch_size = int(llm.batch_size)
        self.max_new_tokens = int(llm.max_new_tokens)
        self.store_tokens = store_tokens  # every token's states too, beside the pooled ones (the stage's option)

    @classmethod
    def from_config(cls, prompt: PromptSettings, llm: LLMSettings, tokenizer: Any,
                    store_tokens: bool = False) -> Runner:
        return cls(PromptBuilder.from_config(prompt, tokenizer), llm, store_tokens)

    # ------------------------------------------------------------------ examples -> prompts
    def prompt(self, example: Example, demos: Sequence[Example]) -> Prompt:
        """``example``'s prompt with ``demos`` (most similar first), the least similar dropped until it fits."""
        return self.builder.build(example, demos, self.budget)

    def prompts(self, examples: Mapping[K, Example], demos: Mapping[str, Sequence[str]], pool: Mapping[str, Example],
                desc: str | None = None) -> tuple[dict[K, Prompt], dict[K, UserError]]:
        """Each example's prompt, in key order, with its retrieved demonstrations (``demos``: ids by example id,
        looked up in ``pool``), and the examples that have none, with why (:class:`~mice_exp.llm.prompt.PromptTooLong`:
        too long even without demonstrations; tools the prompt cannot show). ``desc``: a progress bar's title."""
        built: dict[K, Prompt] = {}
        refused: dict[K, UserError] = {}
        for key in tqdm(sorted(examples), desc=desc, leave=False, disable=desc is None):
            example = examples[key]
            try:
                built[key] = self.prompt(example, [pool[d] for d in demos[example.id]])
            except UserError as error:
                refused[key] = error
        return built, refused

    def batches(self, prompts: Mapping[K, Prompt]) -> list[list[K]]:
        return batches(prompts, self.batch_size)

    # ------------------------------------------------------------------ batches -> records
    def records(self, tokenizer: Any, calls: Calls[K], batch: Sequence[K],
                gens: Sequence[Generation]) -> tuple[list[Record], dict[str, np.ndarray]]:
        """The records and pooled arrays of a batch's generations, generated or teacher-forced: each layer's lens
        tokens as text, then :func:`make_record`."""
        lens_text = [tokenizer.batch_decode(g.lens_ids.tolist(), skip_special_tokens=True,
                                            clean_up_tokenization_spaces=False) for g in gens]
        records = [make_record(calls.examples[i], calls.splits[i], calls.prompts[i], g, t, self.fmt)
                   for i, g, t in zip(batch, gens, lens_text)]
        return records, shard_arrays([g.states for g in gens], self.store_tokens)

    def generate(self, llm: Any, calls: Calls[K], batch: Sequence[K]) -> Batch[K]:
        """One batch generated greedily by ``llm`` (the backend's generator) with capture."""
        tick = time.perf_counter()
        gens = generate_batch(llm, [calls.prompts[i].ids for i in batch], self.max_new_tokens, self.fmt)
        records, arrays = self.records(llm.tokenizer, calls, batch, gens)
        return Batch(list(batch), records, arrays, {"generate_s": time.perf_counter() - tick})

    def force(self, teacher: Any, calls: Calls[K], batch: Sequence[K], replies: Mapping[K, Sequence[int]], *,
              lens: bool = True, states: bool = True) -> Batch[K]:
        """One batch's ``replies`` teacher-forced after their prompts (one forward pass; ``lens`` / ``states``:
        whether it computes the logit lens and keeps the states, :meth:`mice_exp.llm.teacher.Teacher.score`)."""
        tick = time.perf_counter()
        gens = teacher.score([calls.prompts[i].ids for i in batch], [replies[i] for i in batch], lens=lens,
                             states=states)
        middle = time.perf_counter()
        records, arrays = self.records(teacher.tokenizer, calls, batch, gens)
        return Batch(list(batch), records, arrays,
                     {"forward_s": middle - tick, "records_s": time.perf_counter() - middle})

    def run(self, model: Any, calls: Calls[K], replies: Mapping[K, Sequence[int]] | None = None, *,
            lens: bool = True, states: bool = True, desc: str | None = None) -> Batch[K]:
        """Every batch of ``calls`` (:meth:`batches`) in memory, as one: generated by ``model`` (a generator), or
        with ``replies`` teacher-forced by it (a teacher). ``desc``: a progress bar's title."""
        done = []
        for batch in tqdm(self.batches(calls.prompts), desc=desc, unit="batch", leave=False, disable=desc is None):
            done.append(self.generate(model, calls, batch) if replies is None else
                        self.force(model, calls, batch, replies, lens=lens, states=states))
        return Batch.joined(done)

    def force_shared(self, teacher: Any, example: Example, split: str, prompt: Prompt,
                     replies: Sequence[str]) -> list[Record]:
        """The records of many replies (texts) to one example's prompt, teacher-forced after one prefill of it
        (:meth:`mice_exp.llm.teacher.Teacher.score_shared`: K agents' calls on a query), with the lens, no states."""
        tokens = [reply_tokens(teacher.tokenizer, text) for text in replies]
        gens = teacher.score_shared(prompt.ids, tokens, lens=True, states=False)
        one = Calls({example.id: example}, {example.id: split}, {example.id: prompt})
        return self.records(teacher.tokenizer, one, [example.id] * len(tokens), gens)[0]

    def replayed(self, teacher: Any, prompts: Sequence[Sequence[int]],
                 replies: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
        """The pooled arrays of recorded replies' states, each teacher-forced after its (rebuilt) prompt alone,
        at the positions that generated it (a records file's states replayed)."""
        return shard_arrays([teacher.states(p, r) for p, r in zip(prompts, replies)], store_tokens=False)

    def past_window(self, prompts: Mapping[K, Prompt], replies: Mapping[K, Sequence[int]]) -> K | None:
        """The first call whose prompt and reply together do not fit the LLM's context window, or None."""
        return next((i for i, prompt in prompts.items() if len(prompt.ids) + len(replies[i]) > self.window), None)
