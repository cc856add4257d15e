"""The LLM stage: prompt, generate with capture, label, and stream everything to a resumable cache.

Layout of ``<cache>/llm/<llm name>-<key>/``:
  meta.json            what the key hashes (dataset, split, prompt, LLM, generation)
  demos.json           retrieved demonstration ids per example
  shard-NNNNN.npz      per batch: pooled states [B, L, d] (mean / last / first), optional token states
  shard-NNNNN.jsonl    per batch: one record per example (written last: it marks the shard complete)
  done.json            summary once every shard exists
  workers/             local workers' config and logs (``llm.shards``, :mod:`mice_exp.llm.shards`)
Batches are fixed by (prompt length, id) order, so a killed run recomputes exactly the
batch it lost and ends with the same records as an uninterrupted one, and ``llm.shards`` workers
computing a share of the batches each end with them too.
"""

from __future__ import annotations

import logging
from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping, Sequence

from filelock import FileLock
from tqdm.auto import tqdm

from mice_exp.cache import (read_intact, read_json, read_jsonl, read_npz, stable_hash, write_guard, write_json,
                            write_jsonl, write_npz)
from mice_exp.data import Dataset, Example, Selection, demo_pool, make_dataset
from mice_exp.data.labels import call_expected
from mice_exp.devices import resolve_device
from mice_exp.errors import UserError
from mice_exp.llm.backends import Backend, backend_of
from mice_exp.llm.headroom import Headroom
from mice_exp.llm.records import StageOutput, made_of, read_records_file, read_stage, shard_name, shards, summarise
from mice_exp.llm.runner import Calls, Retrieval, Runner
from mice_exp.llm.settings import LLMSettings, PromptSettings, RetrievalSettings
from mice_exp.llm.shards import ShardPlan, run_workers
from mice_exp.paths import Paths, resolve

STAGE_VERSION = 1
log = logging.getLogger(__name__)


class LLMStage:
    """One run's LLM stage: what its key hashes (the data set, ``prompt``, ``llm``, ``retrieval``), the
    run's examples (selected once, on first use: a bad data file fails inside the run), its cache folder and
    the backend that computes it, loaded only when a batch is missing (:class:`~mice_exp.llm.backends.Backend`).

    The LLM stage of a run, the local workers of a sharded one (:mod:`mice_exp.llm.shard_worker`), the
    confidence sources and the replayed states all read the stage through this object.
    """

    def __init__(self, dataset: Dataset, prompt: PromptSettings, llm: LLMSettings, retrieval: RetrievalSettings,
                 paths: Paths, backend: Backend | None = None, selection: Selection | None = None) -> None:
        self.dataset, self.prompt, self.llm, self.retrieval = dataset, prompt, llm, retrieval
        self.paths = paths
        self.backend = backend or backend_of(llm, paths.models)
        if selection is not None:  # a selection the caller already holds (tests)
            self.selection = selection

    @cached_property
    def selection(self) -> Selection:
        """The run's examples and their splits (``conf/dataset``)."""
        return self.dataset.select(self.paths)

    def settings(self) -> dict[str, Mapping[str, Any]]:
        """The config groups the stage is built from, as plain mappings: what its local workers start with."""
        groups = (self.prompt, self.llm, self.retrieval)
        return {"dataset": self.dataset.settings} | {group.group: group.as_dict() for group in groups}

    @classmethod
    def from_settings(cls, settings: Mapping[str, Mapping[str, Any]], paths: Paths,
                      shard: int | None = None) -> LLMStage:
        """The stage of :meth:`settings`, as worker ``shard`` of its ``llm.shards`` where given (a local worker)."""
        groups = {c.group: c.from_config(settings[c.group]) for c in (PromptSettings, LLMSettings, RetrievalSettings)}
        if shard is not None:
            groups |= {LLMSettings.group: groups[LLMSettings.group].overridden(shard=shard)}
        return cls(make_dataset(settings["dataset"]), **groups, paths=paths)

    def key(self, device: str) -> dict[str, Any]:
        """Everything that changes the stage's output, and nothing else."""
        return {
            "version": STAGE_VERSION,
            "dataset": self.dataset.key(),
            "examples": stable_hash([(e.id, e.query, e.tools, e.demo) + ((e.conversation,) if e.conversation else ())
                                     for e in self.selection.examples]),
            "splits": stable_hash(sorted(self.selection.splits.items())),
            "retrieval": self.retrieval.as_dict(),
            "prompt": self.prompt.key(),
            "llm": self.llm.key(device) | self.backend.key(),
        }

    def folder(self) -> tuple[Path, dict[str, Any]]:
        """The stage's cache folder (``<cache>/llm/<llm>-<key hash>``) and its key."""
        key = self.key(resolve_device(self.llm.device).type)
        return self.paths.llm / f"{self.llm.name}-{stable_hash(key)}", key

    @property
    def records_path(self) -> Path | None:
        """The published records file the run reads instead of computing the stage (``llm.records``)."""
        return resolve(self.llm.records, self.paths.root) if self.llm.records else None

    def made_with(self) -> dict[str, Any]:
        """What must have produced a records file this stage reads (:func:`~mice_exp.llm.records.made_with`)."""
        return made_of(self.llm.name, self.llm.max_new_tokens, self.prompt.as_dict())

    def output(self, needs: Sequence[str] = ()) -> StageOutput:
        """The stage's records: from the records file (cut to the run's selection; ``needs``: the record fields
        the run's view reads), or from the cache, computed or resumed where batches are missing."""
        if self.records_path is not None:
            return read_records_file(self.records_path, self.dataset.name, needs, self.selection.splits,
                                     expect=self.made_with())
        return read_stage(self.run())

    def demos(self, out: Path) -> dict[str, list[str]]:
        """Each example's ``prompt.k_demos`` most similar pool examples' ids (``prompt.demo_pool``), retrieved
        once and kept in ``out/demos.json`` (under a lock: workers of one stage started at once retrieve once)."""
        selection, retrieval = self.selection, Retrieval.from_config(self.prompt, self.retrieval)
        if not retrieval.k:  # zero-shot: nothing to retrieve, nothing to keep
            return retrieval.rank(selection.examples, [], retrieval.encoder)
        out.mkdir(parents=True, exist_ok=True)
        with FileLock(str(out / ".lock-demos")):
            cached = read_intact(out / "demos.json", read_json)
            if cached is not None:
                return cached
            pool_name = self.prompt.demo_pool
            pool = demo_pool(selection, pool_name)
            if pool_name == "train":
                per_api = Counter(e.api for e in pool)
                short = sorted({e.api for e in selection.examples if per_api[e.api] < retrieval.k + 1})
                if short:
                    log.info("prompt.demo_pool=train: %d of the %d APIs have fewer than k_demos + 1 = %d training "
                             "calls (e.g. %s); their calls' demonstrations include other APIs' training calls",
                             len(short), len({e.api for e in selection.examples}), retrieval.k + 1, short[0])
            demos = retrieval.rank(selection.examples, pool, retrieval.encoder)
            write_json(out / "demos.json", demos)
        return demos

    def runner(self, tokenizer: Any) -> Runner:
        """How the stage's calls are prompted (with ``tokenizer``: its generator's, or its teacher's), batched and
        recorded: the stage's own loop, the replay's and the judge's (:class:`~mice_exp.llm.runner.Runner`)."""
        return Runner.from_config(self.prompt, self.llm, tokenizer, bool(self.llm.store_token_states))

    def derived_folder(self, output: StageOutput) -> Path:
        """Where the caches derived from the stage's output live (sources, replayed states): the stage's own
        folder, or for a records file ``<cache>/llm/<llm>-records-<sha>/``."""
        return output.folder or self.paths.llm / f"{self.llm.name}-{output.key}"

    def context(self, output: StageOutput) -> tuple[Path, dict[str, Example], dict[str, list[str]]]:
        """Where the caches derived from ``output`` live, its examples by id and each one's retrieved
        demonstrations (for a records file retrieved again there; each prompt rebuilt from them is then
        checked against its record's hash, :class:`mice_exp.llm.sources.Prompts`)."""
        folder = self.derived_folder(output)
        examples = {e.id: e for e in self.selection.examples}
        missing = [r["id"] for r in output.records if r["id"] not in examples]
        if missing:
            raise UserError(f"{len(missing)} records (e.g. {missing[0]}) are not in this run's dataset selection; "
                            "expected the records' own dataset settings")
        return folder, examples, self.demos(folder)

    def run(self) -> Path:
        """Compute (or resume, or reuse) the LLM stage; return its cache folder.

        Concurrent jobs with the same key wait on a file lock and then read the result. With
        ``llm.shards=N`` the batches are shared by N workers (:mod:`mice_exp.llm.shards`): ``llm.shard=i``
        computes worker i's only (the folder is complete, with ``done.json``, once every worker has run);
        without it N local worker processes compute them all.
        """
        out, key = self.folder()
        _set_aside_damaged(out)
        if out.is_dir() and read_intact(out / "meta.json", read_json) != key:  # damaged or lost: it is the key itself
            write_json(out / "meta.json", key)
        if (out / "done.json").exists():
            return out
        plan = self.plan()
        out.mkdir(parents=True, exist_ok=True)
        if plan.launches:
            write_json(out / "meta.json", key)
            self.demos(out)  # once, before the workers start
            run_workers(self.settings(), self.llm, self.paths, out, plan)
            return out
        with FileLock(str(out / plan.lock)):
            if (out / "done.json").exists():
                return out
            write_json(out / "meta.json", key)
            log.info("computing the LLM stage in %s%s", out,
                     "" if plan.worker is None else f" (worker {plan.worker} of {plan.count})")
            with write_guard(out, lambda: f"{len(shards(out))} complete shards kept in {out}; a re-run resumes"):
                self._compute(out, plan)
        return out

    def plan(self) -> ShardPlan:
        """Which batches this process computes (``llm.shards`` / ``llm.shard``)."""
        return ShardPlan.from_config(self.llm, len(self.selection.examples))

    def shard_note(self, out: Path) -> str | None:
        """What a run of one worker (``llm.shard``) prints once it is done: None when the stage is complete
        (``done.json``), else how much of it is and what completes it."""
        if (out / "done.json").exists():
            return None
        plan = self.plan()
        return (f"llm.shard={plan.worker}: worker {plan.worker} of {plan.count} is done; {len(shards(out))} of the "
                f"LLM stage's {plan.batches} batches are in {out}; the stage is complete once every "
                f"llm.shard=0..{plan.count - 1} has run (then run without llm.shard)")

    def _compute(self, out: Path, plan: ShardPlan) -> None:
        examples = {e.id: e for e in self.selection.examples}
        if self.prompt.no_call_note is None and any(call_expected(e) is not None for e in examples.values()):
            log.warning("the data set holds queries where making no call may be the right answer, but "
                        "prompt.no_call_note is null: the prompt does not say so (a data set's YAML suggests one as "
                        "dataset.no_call_note, e.g. dataset=bfcl_relevance)")
        demos = self.demos(out)
        llm = self.backend.generator()
        runner = self.runner(llm.tokenizer)
        prompts, refused = runner.prompts(examples, demos, examples, desc="prompts")
        if refused:
            raise next(iter(refused.values()))
        calls = Calls(examples, self.selection.splits, prompts)
        fixed = runner.batches(prompts)
        names = [shard_name(n, len(fixed)) for n in range(len(fixed))]
        mine = [n for n in range(len(fixed)) if plan.owns(n)]
        todo = [(n, fixed[n]) for n in mine if not (out / f"{names[n]}.jsonl").exists()]
        total = sum(len(fixed[n]) for n in mine)
        bar = tqdm(total=total, initial=total - sum(len(b) for _, b in todo), desc=f"LLM {llm.name}", unit="ex")
        headroom = Headroom()
        headroom.start()
        for n, batch in todo:
            longest = max(len(prompts[i].ids) for i in batch)
            if (warning := headroom.warning(len(batch), longest)) is not None:
                log.warning(warning)
            done = runner.generate(llm, calls, batch)
            write_npz(out / f"{names[n]}.npz", done.arrays)
            write_jsonl(out / f"{names[n]}.jsonl", done.records)
            headroom.done(longest)
            bar.update(len(batch))
        bar.close()
        if all((out / f"{name}.jsonl").exists() for name in names):  # the last worker to finish merges
            write_json(out / "done.json", summarise(read_stage(out).records)
                       | {"n_layers": llm.n_layers, "hidden_size": llm.hidden_size})


def _set_aside_damaged(out: Path) -> None:
    """A damaged shard file or done.json is set aside with a warning (:func:`read_intact`); dropping its
    shard's completion mark (the jsonl) and done.json makes the run regenerate that shard and nothing else."""
    damaged = False
    for jsonl in shards(out):
        if read_intact(jsonl, read_jsonl) is None or read_intact(jsonl.with_suffix(".npz"), read_npz) is None:
            jsonl.unlink(missing_ok=True)
            damaged = True
    if damaged:
        (out / "done.json").unlink(missing_ok=True)
    else:
        read_intact(out / "done.json", read_json)
