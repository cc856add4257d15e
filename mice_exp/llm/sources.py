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

Each source is a small calculator, :class:`Source` (in the manner of lm-polygraph's stat calculators): its name,
what it asks the backend's source runner (``needs``: the option tokens' probabilities, a greedy reply or k
samples), the prompt it asks about and how its value follows from the answer; the sources of one conf/sources
block share one answer. The runner is the backend's (:meth:`mice_exp.llm.backends.Backend.source_runner`); a
backend whose runner cannot answer a source's needs is refused before any model loads. Each source is stored as
``<llm cache>/source-<name>-<key>/shard-NNNNN.jsonl`` (one shard per batch of records, resumable like the LLM
stage), keyed by its block's settings, the prompt and how the backend computes sources.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from filelock import FileLock
from tqdm.auto import tqdm

from mice_exp.cache import read_jsonl, stable_hash, write_jsonl
from mice_exp.errors import UserError
from mice_exp.llm.generation import truncate
from mice_exp.llm.prompt import PromptBuilder
from mice_exp.llm.records import StageOutput
from mice_exp.llm.settings import LLMSettings, PromptSettings
from mice_exp.llm.stage import LLMStage

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


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


def sample_budget(record: Mapping[str, Any], settings: Mapping[str, Any], llm: LLMSettings) -> int:
    """New tokens per self-consistency sample: the greedy call's length plus ``extra_tokens``, at most
    ``llm.max_new_tokens``. Samples at temperature 1 from a small model rarely stop on their own, so the
    batch ran to the full budget; a sample that agrees with the greedy call is as long as it give or take a
    few whitespace tokens (on 12 SmolLM2 test calls, 120 samples: at most 2 tokens longer, and every
    agreement the same with the cap as without; the samples are the same, only cut)."""
    budget = int(llm.max_new_tokens)
    extra = settings.get("extra_tokens")
    return budget if extra is None else min(budget, len(record["token_ids"]) + int(extra))


class Reply:
    """One call's prompts, each asked of the backend's source runner once however many sources read its answer (one
    set of samples serves self-consistency and semantic entropy), and what the sources' values read."""

    def __init__(self, runner: Any, settings: Mapping[str, Any], llm_settings: LLMSettings, prompts: Prompts,
                 sources: Sequence[Source], call: Any = None):
        self.runner, self.settings, self.llm_settings, self.prompts = runner, settings, llm_settings, prompts
        self.record, self.fmt = prompts.record, prompts.builder.fmt
        self.variants = {s.block: s.prompt(prompts, settings[s.block]) for s in sources}
        self.call = runner.call(list(self.variants.values())) if call is None else call
        self._answers: dict[str, Any] = {}

    def answer(self, source: Source) -> Any:
        if source.block not in self._answers:
            self._answers[source.block] = ASKS[source.needs](self, self.variants[source.block],
                                                             self.settings[source.block])
        return self._answers[source.block]

    def text(self, ids: Sequence[int]) -> str:
        """Generated ids as the stage cuts a call (at EOS and the call's stop)."""
        return truncate(self.runner.tokenizer, ids, self.runner.eos, self.fmt)[2]

    def calls(self, samples: Sequence[Sequence[int]]) -> list[Any]:
        return [self.fmt.parse(self.text(ids)) for ids in samples]


#: What each ability of a source runner (:data:`mice_exp.llm.backends.ABILITIES`) asks of one call's prompt.
ASKS: dict[str, Callable[[Reply, list[int], Mapping[str, Any]], Any]] = {
    "option_probs": lambda reply, prompt, block: reply.call.p_true(prompt),
    "greedy": lambda reply, prompt, block: reply.call.greedy(prompt, int(block["max_new_tokens"]), reply.fmt),
    "samples": lambda reply, prompt, block: reply.call.samples(
        prompt, int(block["samples"]), float(block["temperature"]),
        sample_budget(reply.record, block, reply.llm_settings), reply.fmt),
}


@dataclass(frozen=True)
class Source:
    """A confidence source: its name (``sources.use``, its cache folder), what it asks the backend's source runner
    (``needs``, a key of :data:`ASKS`), the conf/sources block that sets it and keys its cache (the sources of one
    block share one answer), the prompt it asks about and its value from the answer."""

    name: str
    needs: str
    block: str
    prompt: Callable[[Prompts, Mapping[str, Any]], list[int]]
    compute: Callable[[Any, Reply, Mapping[str, Any]], Any]


def _followup(prompts: Prompts, block: Mapping[str, Any]) -> list[int]:
    return prompts.followup(block["question"])


def _way_out(prompts: Prompts, block: Mapping[str, Any]) -> list[int]:
    return prompts.with_note(block["instruction"])


def _original(prompts: Prompts, block: Mapping[str, Any]) -> list[int]:
    return prompts.original


#: Every source, in computing order.
SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("p_true", "option_probs", "p_true", _followup, lambda p, reply, block: p),
    Source("verbalized", "greedy", "verbalized", _followup,
           lambda ids, reply, block: parse_percent(reply.runner.tokenizer.decode(ids, skip_special_tokens=True))),
    Source("acts", "greedy", "acts", _way_out,
           lambda ids, reply, block: 0.0 if block["abstain_api"] in reply.text(ids) else 1.0),
    Source("consistency", "samples", "consistency", _original,
           lambda samples, reply, block: agreement(reply.calls(samples), reply.record)),
    Source("semantic_entropy", "samples", "consistency", _original,
           lambda samples, reply, block: semantic_confidence(reply.calls(samples))),
)}


#: The sources that ask about the call itself (a follow-up after it), so a judge can ask them of a call another
#: agent made; the others read the judge's own generations (samples, a way out), which a given call has none of.
ABOUT_THE_CALL = ("p_true", "verbalized")


def about_the_call(names: Sequence[str]) -> list[str]:
    """``sources.use`` for judged calls, refused in one line where it names a source no given call can answer."""
    unknown = [n for n in names if n not in ABOUT_THE_CALL]
    if unknown:
        raise UserError(f"sources.use lists {unknown} for judged calls; expected some of {', '.join(ABOUT_THE_CALL)} "
                        "(the others read the judge's own generations, and a given call has none)")
    return list(names)


def given_call_values(runner: Any, settings: Mapping[str, Any], llm_settings: LLMSettings,
                      prompts: Sequence[Prompts], names: Sequence[str]) -> list[dict[str, Any]]:
    """The named sources of several calls answering one prompt (other agents' calls a judge scores), from one
    runner call over all their follow-ups: the prefix they share (the query's prompt) is encoded once."""
    sources = [SOURCES[name] for name in names]
    call = runner.call([s.prompt(p, settings[s.block]) for p in prompts for s in sources])
    replies = [Reply(runner, settings, llm_settings, p, sources, call) for p in prompts]
    return [{s.name: s.compute(r.answer(s), r, settings[s.block]) for s in sources} for r in replies]


def source_dir(llm_dir: Path, name: str, settings: Mapping[str, Any], prompt: PromptSettings, method: str) -> Path:
    key = {"settings": dict(settings), "prompt": prompt.key(), "method": method}
    return llm_dir / f"source-{name}-{stable_hash(key)}"


def call_values(runner: Any, settings: Mapping[str, Any], llm_settings: LLMSettings, prompts: Prompts,
                names: Sequence[str]) -> dict[str, Any]:
    """Every named source of one call (``settings``: conf/sources; ``llm_settings``: conf/llm, the samples'
    budget) from the backend's source ``runner``."""
    sources = [SOURCES[name] for name in names]
    reply = Reply(runner, settings, llm_settings, prompts, sources)
    return {s.name: s.compute(reply.answer(s), reply, settings[s.block]) for s in sources}


def source_folders(names: Sequence[str], settings: Mapping[str, Any], prompt: PromptSettings,
                   llm_dir: Path, method: str) -> dict[str, Path]:
    """Each named source's cache folder beside an LLM stage, in computing order (an unknown name is one line);
    ``method``: how the backend computes sources (:attr:`~mice_exp.llm.backends.Backend.source_method`)."""
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise UserError(f"sources.use lists {unknown}; expected some of {', '.join(SOURCES)}")
    return {n: source_dir(llm_dir, n, settings[s.block], prompt, method) for n, s in SOURCES.items() if n in names}


def compute_sources(names: Sequence[str], settings: Mapping[str, Any], stage: LLMStage, llm_dir: Path,
                    examples: Mapping[str, Any], demos: Mapping[str, list[str]], records: list[dict[str, Any]],
                    runner: Any) -> dict[str, Path]:
    """Compute the named sources (``settings``: conf/sources) for every record of ``stage`` with the backend's source
    ``runner`` (:meth:`~mice_exp.llm.backends.Backend.source_runner`), following the stage's prompt and batches
    (resuming finished batches); return their folders.

    A source whose ``splits`` setting lists splits (self-consistency: k generations per call) is
    computed for those records only; the others are missing (None).
    """
    folders = source_folders(names, settings, stage.prompt, llm_dir, stage.backend.source_method)
    names = list(folders)
    size = int(stage.llm.batch_size)
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
                mine = [name for name in todo if record["split"] in (settings[SOURCES[name].block].get("splits")
                                                                       or [record["split"]])]
                prompts = record_prompts(builder, examples, demos, record) if mine else None
                values = call_values(runner, settings, stage.llm, prompts, mine) if mine else {}
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
    folders = source_folders(names, settings, stage.prompt, stage.derived_folder(output), stage.backend.source_method)
    batches = range(-(-len(output.records) // int(stage.llm.batch_size)))
    if not all((folder / f"shard-{n:05d}.jsonl").exists() for folder in folders.values() for n in batches):
        folder, examples, demos = stage.context(output)
        compute_sources(names, settings, stage, folder, examples, demos, output.records,
                        stage.backend.source_runner())
    return {name: load_source(folders[name], output.ids) for name in names}
