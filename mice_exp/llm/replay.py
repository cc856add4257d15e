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

import numpy as np
from filelock import FileLock
from tqdm.auto import tqdm

from mice_exp.cache import read_npz, stable_hash, write_npz
from mice_exp.errors import UserError
from mice_exp.llm.records import ARRAYS, FORMAT_DEFAULTS, StageOutput
from mice_exp.llm.sources import record_prompts
from mice_exp.llm.stage import LLMStage

NEEDS = ("token_ids", "n_demos", "prompt_hash")  # what a record must keep to be replayed
log = logging.getLogger(__name__)


def replay_activations(stage: LLMStage, output: StageOutput) -> dict[str, np.ndarray]:
    """The pooled states (:data:`~mice_exp.llm.records.ARRAYS`, each [N, L, d]) of every record of a
    records file read by ``stage``, replayed where not cached: only then does the stage's LLM load."""
    llm = stage.llm
    wrote = output.info.get("llm")
    if wrote is not None and wrote != llm.name:
        raise UserError(f"llm.records={llm.records} was written by {wrote}, not llm={llm.name}; "
                        f"its hidden states can only be replayed by the LLM that generated it (expected llm={wrote})")
    for name in NEEDS:
        missing = sum(name not in r for r in output.records)
        if missing:
            raise UserError(f"llm.records={llm.records}: {missing} records lack {name!r}, which replaying "
                            "their hidden states needs (expected a records file written by `mice-exp records`)")
    # every prompt setting but the formats at their defaults (the key kept demo_pool and no_call_note from the start)
    key = {"method": stage.backend.replay_method, "prompt": stage.prompt.key(FORMAT_DEFAULTS), **llm.weights()}
    out = stage.derived_folder(output) / f"activations-{stable_hash(key)}"
    size = int(llm.batch_size)
    groups = [output.records[lo:lo + size] for lo in range(0, len(output.records), size)]
    out.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out / ".lock")):
        todo = [n for n in range(len(groups)) if not (out / f"shard-{n:05d}.npz").exists()]
        if todo:
            pending = sum(len(groups[n]) for n in todo)
            log.info("%s keeps no activations: replaying %d calls with %s into %s", llm.records, pending, llm.name, out)
            _, examples, demos = stage.context(output)
            teacher = stage.backend.teacher()
            runner = stage.runner(teacher.tokenizer)
            bar = tqdm(total=len(output.records), initial=len(output.records) - pending,
                       desc=f"replay {llm.name}", unit="call")
            for n in todo:
                prompts = [record_prompts(runner.builder, examples, demos, r).original for r in groups[n]]
                replies = [r["token_ids"] for r in groups[n]]
                write_npz(out / f"shard-{n:05d}.npz", runner.replayed(teacher, prompts, replies))
                bar.update(len(groups[n]))
            bar.close()
    shards = [read_npz(out / f"shard-{n:05d}.npz") for n in range(len(groups))]
    return {name: np.concatenate([s[name] for s in shards]) for name in ARRAYS}
