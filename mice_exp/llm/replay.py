"""Hidden states for a published records file, replayed with one teacher-forced forward per call.

A records file keeps no activations (far too large), so a view or estimator that reads them from
``llm.records`` gets them here: each call's prompt is rebuilt (and checked against its record's
hash), its recorded tokens are appended, and one forward pass captures every layer at the positions
the LLM stage captured at (the ones that predicted each generated token). Same tokens, same positions:
the stage's own states up to float rounding (one pass instead of batched, KV-cached decoding), at the
cost of a prefill -- no decoding loop, no logit lens -- on the backend's teacher (:mod:`mice_exp.llm.teacher`,
or an engine's). Kept in ``<cache>/llm/<llm>-records-<sha>/activations-<key>/shard-NNNNN.npz``; an interrupted
replay resumes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock
from tqdm.auto import tqdm

from mice_exp.cache import read_intact, read_json, read_jsonl, read_npz, stable_hash, write_json, write_jsonl, write_npz
from mice_exp.errors import UserError
from mice_exp.llm.precision import resolve_dtype
from mice_exp.llm.prompt import PromptBuilder
from mice_exp.llm.publish import written_by
from mice_exp.llm.records import (ARRAYS, FORMAT_DEFAULTS, StageOutput, read_records_file, read_records_header,
                                  shard_name)
from mice_exp.llm.sources import record_prompts
from mice_exp.llm.stage import LLMStage, batch_records, batches, prompt_key, shard_arrays
from mice_exp.llm.teacher import reply_tokens

NEEDS = ("token_ids", "n_demos", "prompt_hash")  # what a record must keep to be replayed
#: What a judged record keeps of the actor's: the call as the actor wrote and parsed it, and its label.
ACTOR_FIELDS = ("pred_api", "pred_args", "parse_error", "label")
log = logging.getLogger(__name__)


def replay_activations(stage: LLMStage, output: StageOutput) -> dict[str, np.ndarray]:
    """The pooled states (:data:`~mice_exp.llm.records.ARRAYS`, each [N, L, d]) of every record of a
    records file read by ``stage``, replayed where not cached: only then does the stage's LLM load."""
    llm_cfg = stage.llm
    wrote = output.info.get("llm")
    if wrote is not None and wrote != llm_cfg["name"]:
        raise UserError(f"llm.records={llm_cfg.get('records')} was written by {wrote}, not llm={llm_cfg['name']}; "
                        f"its hidden states can only be replayed by the LLM that generated it (expected llm={wrote})")
    for name in NEEDS:
        missing = sum(name not in r for r in output.records)
        if missing:
            raise UserError(f"llm.records={llm_cfg.get('records')}: {missing} records lack {name!r}, which replaying "
                            "their hidden states needs (expected a records file written by `mice-exp records`)")
    # every prompt setting but the formats at their defaults (the key kept demo_pool and no_call_note from the start)
    key = {"method": stage.backend.replay_method, "prompt": prompt_key(stage.prompt, FORMAT_DEFAULTS),
           "source": llm_cfg["source"],
           "dtype": resolve_dtype(llm_cfg.get("dtype", "float32"), llm_cfg.get("device", "cpu"))}
    out = stage.derived_folder(output) / f"activations-{stable_hash(key)}"
    size = int(llm_cfg["batch_size"])
    groups = [output.records[lo:lo + size] for lo in range(0, len(output.records), size)]
    out.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out / ".lock")):
        todo = [n for n in range(len(groups)) if not (out / f"shard-{n:05d}.npz").exists()]
        if todo:
            pending = sum(len(groups[n]) for n in todo)
            log.info("%s keeps no activations: replaying %d calls with %s into %s", llm_cfg.get("records"),
                     pending, llm_cfg["name"], out)
            _, examples, demos = stage.context(output)
            teacher = stage.backend.teacher()
            builder = PromptBuilder.from_config(stage.prompt, teacher.tokenizer)
            bar = tqdm(total=len(output.records), initial=len(output.records) - pending,
                       desc=f"replay {llm_cfg['name']}", unit="call")
            for n in todo:
                states = [teacher.states(record_prompts(builder, examples, demos, r).original, r["token_ids"])
                          for r in groups[n]]
                write_npz(out / f"shard-{n:05d}.npz", shard_arrays(states, store_tokens=False))
                bar.update(len(groups[n]))
            bar.close()
    shards = [read_npz(out / f"shard-{n:05d}.npz") for n in range(len(groups))]
    return {name: np.concatenate([s[name] for s in shards]) for name in ARRAYS}


def judge_records(stage: LLMStage, actor: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Another LLM's records file (the actor's) replayed through ``stage``'s LLM (the judge): each call's prompt
    built as the judge's own stage builds it (its chat template, its prompt settings, the same retrieved
    demonstrations), the actor's reply teacher-forced as the reply (the backend's teacher,
    :meth:`~mice_exp.llm.backends.Backend.teacher`), so every field the judge reads of its own calls (every layer's
    lens string, raw confidence = the judge's probability of the call's content tokens, token offsets) is the
    judge's, while the parsed call and its label are the actor's (the text is the judge's tokens decoded: the
    actor's, where the judge's tokenizer round-trips it).
    Returns the header and records of a records file of the usual format (``llm`` is the judge: its hidden
    states replay with :func:`replay_activations`), whose header also names ``actor`` and ``judge``. Batches
    are kept in ``<cache>/llm/<judge>-judged-<actor records key>/``: an interrupted replay resumes."""
    judge = stage.llm["name"]
    header = read_records_header(actor) if actor.is_file() else {}
    if header.get("llm") == judge:
        raise UserError(f"actor={actor} was written by {judge} itself; a judge replays another LLM's records "
                        f"(expected llm= another LLM than {judge}, or its own records as they are)")
    settings = {k: v for k, v in stage.made_with().items() if k != "llm"}
    output = read_records_file(actor, stage.dataset.name, ("token_ids",), stage.selection.splits, expect=settings)
    if header.get("judge") is not None:
        raise UserError(f"actor={actor} is already a judged records file ({header['actor']} judged by "
                        f"{header['judge']}); expected an LLM's own records")
    out = stage.paths.llm / f"{judge}-judged-{output.key}{stage.backend.replay_suffix()}"
    _, examples, demos = stage.context(output)
    out.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out / ".lock")):
        done = read_intact(out / "done.json", read_json)
        if done is None:
            done = _judge_batches(stage, output, out, examples, demos, header.get("llm"))
    names = [out / name for name in done["shards"]]
    judged = {r["id"]: r for name in names for r in read_jsonl(name)}
    records = [judged[r["id"]] for r in output.records]  # the actor file's order
    display = f"{header.get('display', header.get('llm'))} judged by {stage.llm.get('display', judge)}"
    info = {"dataset": stage.dataset.name, "llm": judge, "display": display, "actor": header.get("llm"),
            "judge": judge, "actor_records": {"file": actor.name, "key": output.key},
            "n_layers": done["n_layers"], "hidden_size": done["hidden_size"], "examples": len(records), "sources": [],
            "stage_key": stage.key(done["device"]) | {"judged": output.key}, "stage_cache": out.name,
            "written_by": written_by({}, stage.paths.root, f"{header.get('llm')}'s calls judged by {judge}")}
    return info, records


def _judge_batches(stage: LLMStage, output: StageOutput, out: Path, examples: dict[str, Any],
                   demos: dict[str, list[str]], actor: str | None) -> dict[str, Any]:
    """:func:`judge_records`' batches, those not yet in ``out`` computed; ``done.json`` says they all are."""
    judge = stage.llm["name"]
    by_id = {r["id"]: r for r in output.records}
    teacher = stage.backend.teacher()
    builder = PromptBuilder.from_config(stage.prompt, teacher.tokenizer)
    budget = int(stage.llm["context_window"]) - int(stage.llm["max_new_tokens"])
    prompts = {i: builder.build(examples[i], [examples[d] for d in demos[i]], budget) for i in by_id}
    fixed = batches(prompts, int(stage.llm["batch_size"]))
    names = [f"{shard_name(n, len(fixed))}.jsonl" for n in range(len(fixed))]
    todo = [n for n, name in enumerate(names) if not (out / name).exists()]
    bar = tqdm(total=len(prompts), initial=len(prompts) - sum(len(fixed[n]) for n in todo),
               desc=f"{judge} judges {actor}", unit="call")
    splits = {i: r["split"] for i, r in by_id.items()}
    for n in todo:
        batch = fixed[n]
        gens = teacher.score([prompts[i].ids for i in batch],
                             [reply_tokens(teacher.tokenizer, by_id[i]["text"], by_id[i]["token_ids"]) for i in batch])
        rows, _ = batch_records(teacher.tokenizer, batch, examples, splits, prompts, gens, builder.fmt)
        for row in rows:
            if row["text"] != by_id[row["id"]]["text"]:
                log.warning("%s: %s's tokens of the call decode to %r, not the actor's %r", row["id"], judge,
                            row["text"][:80], by_id[row["id"]]["text"][:80])
        write_jsonl(out / names[n], [row | {k: by_id[row["id"]][k] for k in ACTOR_FIELDS} for row in rows])
        bar.update(len(batch))
    bar.close()
    done = {"shards": names, "n_layers": teacher.n_layers, "hidden_size": teacher.hidden_size,
            "device": teacher.device}
    write_json(out / "done.json", done)
    return done
