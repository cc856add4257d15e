"""Confidence sources beyond raw token probability, computed after the LLM stage and cached beside it.

- ``p_true`` (Kadavath et al.): after the generated call, ask whether it is correct with
  options (A) yes / (B) no; confidence = P(A) / (P(A) + P(B)) from the next-token distribution.
- ``verbalized``: ask for a confidence from 0 to 100 in a separate turn; unparseable
  answers are recorded as missing (None), never guessed.
- ``consistency``: k samples at a temperature; confidence = the fraction whose parsed call
  (API and argument JSON) equals the greedy call's.
- ``semantic_entropy`` (Kuhn et al., 2023, for tool calls): the same k samples clustered by their parsed
  call (equal API and arguments in one cluster, each unparseable sample alone); confidence = 1 - the
  entropy of the cluster shares over its maximum, log k. Drawn with ``consistency``'s settings, so both
  read one set of samples when computed together.
- ``acts`` (Pal et al., 2026): the same prompt with a way out offered after the query (the wording
  is config) -- 1 if the model still calls an API, 0 if it takes the way out. Not a confidence: the
  behaviour that action-belief consistency compares with every confidence.

All four prompts of a call begin with the same tokens (the instructions, the demonstrations and the
query: ~98% of an 8-shot prompt), so each call's shared prefix is encoded once and every source
continues from a copy of that cache (a sliding-window layer cannot be cropped back); the prefill is most of the cost. Each source is
stored as ``<llm cache>/source-<name>-<key>/shard-NNNNN.jsonl`` (one shard per batch of records,
resumable like the LLM stage), keyed by the source's own settings.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from filelock import FileLock
from transformers import DynamicCache
from tqdm.auto import tqdm

from mice_exp.cache import read_jsonl, stable_hash, write_jsonl
from mice_exp.errors import UserError
from mice_exp.llm.capture import generate_ids, truncate
from mice_exp.llm.model import LLM
from mice_exp.llm.backends.openai import ENDPOINT_METHOD, EndpointSources
from mice_exp.llm.prompt import PromptBuilder, option_token_ids
from mice_exp.llm.records import SOURCES, StageOutput
from mice_exp.llm.stage import LazyLLM, LLMStage, prompt_key
from mice_exp.llm.toolcall import CallFormat

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
METHOD = "shared-prefix-1"  # how sources are computed; part of their cache key
ORDER = ("p_true", "verbalized", "acts", "consistency", "semantic_entropy")
SAMPLED = ("consistency", "semantic_entropy")  # one set of k samples serves both


def parse_percent(text: str) -> float | None:
    """The first number in ``text`` as a probability if it lies in [0, 100], else None."""
    match = _NUMBER.search(text)
    if match is None or float(match.group()) > 100:
        return None
    return float(match.group()) / 100


def agreement(calls: Sequence[Any], record: Mapping[str, Any]) -> float:
    """Share of sampled calls equal (API and arguments) to the record's greedy call; 0 if it did not parse."""
    if record["parse_error"] is not None:
        return 0.0
    return float(np.mean([(c.api, c.args) == (record["pred_api"], record["pred_args"]) for c in calls]))


def semantic_confidence(calls: Sequence[Any]) -> float:
    """1 - normalised entropy of the samples' clusters of equal parsed calls (unparseable: one cluster each);
    1 when every sample makes the same call, 0 when all k differ."""
    if len(calls) < 2:
        return 1.0
    keys = [json.dumps([c.api, c.args], sort_keys=True) if c.parse_error is None else i for i, c in enumerate(calls)]
    shares = np.array(list(Counter(keys).values()), dtype=np.float64) / len(keys)
    return float(1.0 + np.sum(shares * np.log(shares)) / np.log(len(keys)))


def near_orders(demos: list[Any]) -> Iterator[list[Any]]:
    """The retrieved order, then each order with two neighbours swapped: retrieval on another CPU can
    order a near-tie in similarity (1e-7 apart, seen on 1 of 750 STE calls) the other way; the record's
    prompt hash says which order its LLM stage used."""
    yield demos
    for j in range(len(demos) - 1):
        yield demos[:j] + [demos[j + 1], demos[j]] + demos[j + 2:]


class Prompts:
    """The token ids of one call's prompt variants, rebuilt exactly as the LLM stage built its prompt (by the
    same :class:`PromptBuilder`, built once for all calls)."""

    def __init__(self, builder: PromptBuilder, example: Any, demos: Sequence[Any], record: Mapping[str, Any]):
        self.builder, self.example, self.record = builder, example, record
        for order in near_orders(list(demos)):
            self.demos = order
            self.original = builder.encode(example, order)
            if stable_hash(self.original) == record.get("prompt_hash", stable_hash(self.original)):
                return
        raise UserError(f"record {record['id']}: the prompt rebuilt here differs from the one the LLM stage "
                        "generated from (prompt_hash); expected the records' own retrieval and prompt settings")

    def followup(self, question: str) -> list[int]:
        """The original prompt, the model's own call as its answer, then a follow-up question."""
        generated, builder = self.record["text"], self.builder
        if builder.chat:
            messages = builder.messages(self.example, self.demos)
            messages += [{"role": "assistant", "content": generated}, {"role": "user", "content": question}]
            return builder.render(messages, self.example, self.demos)
        text = f"{builder.text(self.example, self.demos)}{generated}\n\n{question}\nAnswer:"
        return builder.tokenizer(text, add_special_tokens=True)["input_ids"]

    def with_note(self, note: str) -> list[int]:
        """The original prompt with ``note`` after the query (the way-out offer)."""
        return self.builder.encode(self.example, self.demos, note)


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
    """The sources from a transformers model's own forward passes (``hf``, and ``vllm``'s lens model), one call
    at a time (:class:`PrefixCall`); samples seeded per batch from torch's global generator."""

    def __init__(self, llm: LLM):
        self.llm, self.tokenizer, self.eos = llm, llm.tokenizer, llm.eos_ids()

    def start_batch(self, seed: int) -> None:
        torch.manual_seed(seed)

    def call(self, prompts: Sequence[Sequence[int]]) -> PrefixCall:
        return PrefixCall(self.llm, prompts)


def sample_budget(record: Mapping[str, Any], settings: Mapping[str, Any], llm_cfg: Mapping[str, Any]) -> int:
    """New tokens per self-consistency sample: the greedy call's length plus ``extra_tokens``, at most
    ``llm.max_new_tokens``. Samples at temperature 1 from a small model rarely stop on their own, so the
    batch ran to the full budget; a sample that agrees with the greedy call is as long as it give or take a
    few whitespace tokens (on 12 SmolLM2 test calls, 120 samples: at most 2 tokens longer, and every
    agreement the same with the cap as without; the samples are the same, only cut)."""
    budget = int(llm_cfg["max_new_tokens"])
    extra = settings.get("extra_tokens")
    return budget if extra is None else min(budget, len(record["token_ids"]) + int(extra))


def settings_of(sources_cfg: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A source's settings: the sampled sources share ``sources.consistency``'s (one set of samples)."""
    return sources_cfg["consistency" if name in SAMPLED else name]


def source_method(llm_settings: Mapping[str, Any]) -> str:
    """How the sources of this conf/llm entry are computed, part of their cache key: a server's (``openai``:
    its own sampling and numerics) or the model's own forward passes (``hf``, and ``vllm``, whose sources run on
    the transformers model of the same weights)."""
    return ENDPOINT_METHOD if llm_settings.get("backend") == "openai" else METHOD


def source_dir(llm_dir: Path, name: str, settings: Mapping[str, Any], prompt_cfg: Mapping[str, Any],
               method: str = METHOD) -> Path:
    key = {"settings": dict(settings), "prompt": prompt_key(prompt_cfg), "method": method}
    return llm_dir / f"source-{name}-{stable_hash(key)}"


def source_runner(backend: LazyLLM) -> Any:
    """What computes the confidence sources: the server itself under ``openai`` (black-box, from its token
    log-probabilities and samples), else the transformers model's own forward passes."""
    if backend.settings.get("backend") == "openai":
        return EndpointSources(backend.generator())
    return PrefixSources(backend.forward_model())


def call_values(runner: Any, settings: Mapping[str, Any], llm_settings: Mapping[str, Any], prompts: Prompts,
                names: Sequence[str]) -> dict[str, Any]:
    """Every named source of one call (``settings``: conf/sources; ``llm_settings``: conf/llm, the samples'
    budget) from ``runner`` (:class:`PrefixSources`, or an endpoint's), one set of samples serving those in
    :data:`SAMPLED`."""
    wanted = {"p_true": lambda: prompts.followup(settings["p_true"]["question"]),
              "verbalized": lambda: prompts.followup(settings["verbalized"]["question"]),
              "acts": lambda: prompts.with_note(settings["acts"]["instruction"]),
              "sampled": lambda: prompts.original}
    steps = list(dict.fromkeys("sampled" if name in SAMPLED else name for name in names))
    variants = {step: wanted[step]() for step in steps}
    call = runner.call(list(variants.values()))
    fmt = prompts.builder.fmt

    def text(ids: Sequence[int]) -> str:
        return truncate(runner.tokenizer, ids, runner.eos, fmt)[2]

    values: dict[str, Any] = {}
    for step, prompt in variants.items():
        if step == "p_true":
            values[step] = call.p_true(prompt)
        elif step == "verbalized":
            ids = call.greedy(prompt, int(settings["verbalized"]["max_new_tokens"]), fmt)
            values[step] = parse_percent(runner.tokenizer.decode(ids, skip_special_tokens=True))
        elif step == "acts":
            ids = call.greedy(prompt, int(settings["acts"]["max_new_tokens"]), fmt)
            values[step] = 0.0 if settings["acts"]["abstain_api"] in text(ids) else 1.0
        else:
            samples = call.samples(prompt, int(settings["consistency"]["samples"]),
                                   float(settings["consistency"]["temperature"]),
                                   sample_budget(prompts.record, settings["consistency"], llm_settings), fmt)
            calls = [fmt.parse(text(ids)) for ids in samples]
            values |= {"consistency": agreement(calls, prompts.record), "semantic_entropy": semantic_confidence(calls)}
    return {name: values[name] for name in names}


def source_folders(names: Sequence[str], settings: Mapping[str, Any], prompt: Mapping[str, Any],
                   llm_dir: Path, method: str = METHOD) -> dict[str, Path]:
    """Each named source's cache folder beside an LLM stage, in computing order (an unknown name is one line)."""
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise UserError(f"sources.use lists {unknown}; expected some of {', '.join(SOURCES)}")
    return {n: source_dir(llm_dir, n, settings_of(settings, n), prompt, method) for n in ORDER if n in names}


def compute_sources(names: Sequence[str], settings: Mapping[str, Any], stage: LLMStage, llm_dir: Path,
                    examples: Mapping[str, Any], demos: Mapping[str, list[str]], records: list[dict[str, Any]],
                    runner: Any) -> dict[str, Path]:
    """Compute the named sources (``settings``: conf/sources) for every record of ``stage`` with ``runner``
    (:class:`PrefixSources`, or :class:`~mice_exp.llm.backends.openai.EndpointSources`), following the stage's
    prompt and batches (resuming finished batches); return their folders.

    A source whose ``splits`` setting lists splits (self-consistency: k generations per call) is
    computed for those records only; the others are missing (None).
    """
    folders = source_folders(names, settings, stage.prompt, llm_dir, source_method(stage.llm))
    names = list(folders)
    size = int(stage.llm["batch_size"])
    builder = PromptBuilder.from_config(stage.prompt, runner.tokenizer)
    with ExitStack() as stack:
        for folder in folders.values():
            folder.mkdir(parents=True, exist_ok=True)
            stack.enter_context(FileLock(str(folder / ".lock")))
        for n, lo in enumerate(tqdm(range(0, len(records), size), desc=f"sources {'+'.join(names)}", unit="batch")):
            todo = [name for name in names if not (folders[name] / f"shard-{n:05d}.jsonl").exists()]
            if not todo:
                continue
            runner.start_batch(int(settings["consistency"]["seed"]) + n)
            rows: dict[str, list[dict[str, Any]]] = {name: [] for name in todo}
            for record in records[lo:lo + size]:
                mine = [name for name in todo if record["split"] in (settings_of(settings, name).get("splits")
                                                                       or [record["split"]])]
                values = (call_values(runner, settings, stage.llm, record_prompts(builder, examples, demos, record), mine)
                          if mine else {})
                for name in todo:
                    rows[name].append({"id": record["id"], "value": values.get(name)})
            for name in todo:
                write_jsonl(folders[name] / f"shard-{n:05d}.jsonl", rows[name])
    return folders


def load_source(folder: Path, ids: Sequence[str]) -> np.ndarray:
    """Values aligned with ``ids``; missing answers are NaN."""
    values = {row["id"]: row["value"] for path in sorted(folder.glob("shard-*.jsonl")) for row in read_jsonl(path)}
    return np.array([np.nan if values.get(i) is None else values[i] for i in ids], dtype=np.float64)


def record_prompts(builder: PromptBuilder, examples: Mapping[str, Any], demos: Mapping[str, list[str]],
                   record: Mapping[str, Any]) -> Prompts:
    """The prompts of one record, with the demonstrations its prompt kept (``n_demos``)."""
    kept = [examples[d] for d in demos[record["id"]][:record["n_demos"]]]
    return Prompts(builder, examples[record["id"]], kept, record)


def stage_sources(settings: Mapping[str, Any], stage: LLMStage, output: StageOutput,
                  names: Sequence[str]) -> dict[str, np.ndarray]:
    """The named sources (``settings``: conf/sources) of every record of ``output``, the stage's records or a
    records file's, computed where not cached: only then does the stage's LLM load. A records file's are
    cached in ``<cache>/llm/<llm>-records-<sha>/`` beside the demonstrations retrieved again for them (each
    prompt is checked against its record's hash)."""
    folders = source_folders(names, settings, stage.prompt, stage.derived_folder(output), source_method(stage.llm))
    batches = range(-(-len(output.records) // int(stage.llm["batch_size"])))
    if not all((folder / f"shard-{n:05d}.jsonl").exists() for folder in folders.values() for n in batches):
        folder, examples, demos = stage.context(output)
        compute_sources(names, settings, stage, folder, examples, demos, output.records, source_runner(stage.backend))
    return {name: load_source(folders[name], output.ids) for name in names}
