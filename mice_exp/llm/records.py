"""The LLM stage's output as the rest of the pipeline sees it: records, a summary, optional arrays.

Torch-free on purpose: feature views, protocols, the report and the gate read the stage through
this module, whether it comes from a stage cache folder (``shard-NNNNN.jsonl`` + ``.npz``) or from
a published records file (``experiments/records/<dataset>-<llm>.jsonl.gz``: a header line, then
one record per call, no activations), so every table can be rebuilt without loading an LLM.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TypedDict

import numpy as np

from mice_exp.cache import read_json_if, read_jsonl, read_npz, stable_hash, write_atomic
from mice_exp.errors import UserError
from mice_exp.llm.toolcall import REACT

FORMAT = "mice_exp.records"
FORMAT_VERSION = 1
ARRAYS = ("first_token", "last_token", "mean_pool")  # per-record [L, d] states the stage pools


class Record(TypedDict):
    """One call's record, as the LLM stage writes it (:func:`mice_exp.llm.runner.make_record`) and every later stage
    reads it: the one list of the fields, in the order a records file writes them (:data:`PUBLISHED`)."""

    id: str
    api: str  # the gold API
    split: str  # train, validation or test
    dataset: str
    prompt_hash: str
    prompt_tokens: int
    n_demos: int
    demos_dropped: int  # demonstrations dropped to fit the context window
    text: str  # the generated reply
    token_ids: list[int]
    token_probs: list[float]
    offsets: list[list[int]]  # each generated token's character span in ``text``
    content_mask: list[bool]  # the tokens of the call's content (what the raw confidence multiplies)
    raw_confidence: float
    min_probability: float
    pred_api: str | None
    pred_args: dict[str, Any] | None
    parse_error: str | None
    label: int  # 1: the call is correct
    layer_strings: list[str]  # the logit lens' reading of each layer
    lens_ids: list[list[int]]  # [L-1, T]: the logit lens' token at each layer and generated token


# What a published record keeps: every field, everything a feature view, protocol or report reads (token offsets
# locate arguments in the text; lens token ids give per-argument lens agreement, ~0.2 MB gzipped per 750
# SmolLM2 calls); activations stay out (far too large).
PUBLISHED = tuple(Record.__annotations__)
# Fields every run reads (labels, splits, the table's raw confidence, the per-argument and API-name scores).
REQUIRED: tuple[str, ...] = ("id", "api", "split", "label", "raw_confidence", "text", "offsets", "token_probs", "layer_strings",
            "pred_api", "pred_args", "parse_error")


@dataclass
class StageOutput:
    """Records of one LLM stage (one per call, in a fixed order) and where they came from.

    ``key`` names the output for downstream caches (the stage folder's name, or the records
    file's content hash); arrays come from ``folder`` (a stage cache) or ``pooled`` (in memory: the gate's,
    or a records file's states replayed by the run before anything reads them,
    :func:`mice_exp.llm.replay.replay_activations`); a records file alone has neither.
    """

    records: list[Record]
    info: dict[str, Any]
    key: str
    folder: Path | None = None
    pooled: dict[str, np.ndarray] | None = None
    sources: dict[str, list[Any]] = field(default_factory=dict)  # per-record values stored with the records

    @property
    def ids(self) -> list[str]:
        return [r["id"] for r in self.records]

    def with_sources(self) -> list[Record]:
        """Each record with its confidence sources' values under ``"sources"``, as a records file stores them."""
        return [r | {"sources": {k: v[n] for k, v in self.sources.items()}} for n, r in enumerate(self.records)]

    @property
    def n_layers(self) -> int:
        return int(self.info["n_layers"])

    def arrays(self, name: str) -> np.ndarray:
        """A pooled array [N, L, d] aligned with the records (stage caches only)."""
        if name not in ARRAYS:
            raise UserError(f"LLM-stage array {name!r}; expected one of {', '.join(ARRAYS)}")
        if self.pooled is not None:
            return self.pooled[name]
        if self.folder is None:
            raise UserError(f"{name} hidden states are not in a records file ({self.key}); run the LLM stage "
                            "(drop llm.records) for views and estimators that read activations")
        return np.concatenate([read_npz(path.with_suffix(".npz"))[name] for path in shards(self.folder)])


def shards(folder: Path) -> list[Path]:
    """The record shards of a stage cache folder, in batch order."""
    return sorted(folder.glob("shard-*.jsonl"))


def shard_name(batch: int, batches: int) -> str:
    """The file name (without suffix) of batch ``batch`` of a stage of ``batches`` batches: ``shard-00007``."""
    return f"shard-{batch:0{max(5, len(str(batches)))}d}"


def read_stage(folder: Path) -> StageOutput:
    """The records of a (finished or partial) stage cache folder."""
    records = [row for path in shards(folder) for row in read_jsonl(path)]
    return StageOutput(records=records, info=read_json_if(folder / "done.json") or {}, key=folder.name, folder=folder)


def summarise(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts a run prints and logs about its LLM stage."""
    labels = [r["label"] for r in records]
    return {"examples": len(records), "correct": int(sum(labels)), "accuracy": float(np.mean(labels)),
            "parse_errors": sum(r.get("parse_error") is not None for r in records),
            "prompts_with_dropped_demos": sum(r.get("demos_dropped", 0) > 0 for r in records)}


def publishable(record: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a stage record that a records file keeps."""
    return {k: record[k] for k in PUBLISHED if k in record}


def write_records_file(path: Path, header: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> None:
    """Write a gzipped records file: the header (what produced it) then one record per line.

    gzip's mtime and file name are left out so the same records give the same bytes (a clean diff in git).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"format": FORMAT, "version": FORMAT_VERSION, **header}, sort_keys=True)]
    lines += [json.dumps(dict(r), sort_keys=True, ensure_ascii=False) for r in records]
    data = ("\n".join(lines) + "\n").encode("utf-8")

    def gzipped(raw: Any) -> None:
        with gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0, compresslevel=9) as handle:
            handle.write(data)

    write_atomic(path, gzipped)


def _selected(path: Path, records: list[dict[str, Any]], splits: Mapping[str, str],
              partial: bool = False) -> list[dict[str, Any]]:
    """The records of the run's selection, in the file's order, each in the split the run assigns it; ``partial``:
    an actor's judged calls, which hold only the queries it answered with a call that parses (counted in the
    header's ``actor_report``)."""
    kept = [r for r in records if r["id"] in splits]
    if len(kept) < len(splits) and not partial:
        raise UserError(f"llm.records={path} holds {len(kept)} of the {len(splits)} calls this run's dataset "
                        "selection picks; expected a records file written with this selection or a larger one "
                        "(dataset.apis / max_apis / max_per_api)")
    moved = [r for r in kept if r["split"] != splits[r["id"]]]
    if moved:
        first = moved[0]
        raise UserError(f"llm.records={path}: {len(moved)} calls lie in another split than this run's dataset.split "
                        f"and seed assign (e.g. {first['id']!r}: {first['split']} in the file, {splits[first['id']]} "
                        "here); expected the split settings the file was written with")
    return kept


def read_records_header(path: Path) -> dict[str, Any]:
    """The first line of a records file (what produced it); read after :func:`read_records_file` checked it."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.loads(handle.readline())


#: Prompt settings added after the replay key existed, at the value every record had before them (STE's
#: text and ReAct before ``prompt=json_tools``; the demonstrations' tools pooled with the query's, the most
#: similar demonstrations).
FORMAT_DEFAULTS = {"tools": "text", "format": REACT.name, "demo_tools": "pooled", "demo_mix": "similar"}
#: Prompt settings whose value every record had before the setting existed: left out of the keys at that
#: value, so those caches and records files keep their keys (``demo_pool=all``: before the pool existed).
PROMPT_DEFAULTS = {"demo_pool": "all", "no_call_note": None} | FORMAT_DEFAULTS


def made_with(header: Mapping[str, Any]) -> dict[str, Any]:
    """What a records file's header says produced it: the LLM, its generation budget and every prompt setting of
    its stage key (a setting the key leaves out had its default there: :data:`PROMPT_DEFAULTS`,
    ``demo_pool=all`` for a header from before the pool existed)."""
    stage_key = header.get("stage_key") or {}
    return made_of(header.get("llm"), (stage_key.get("llm") or {}).get("max_new_tokens"), stage_key.get("prompt") or {})


def made_of(llm: str | None, max_new_tokens: int | None, prompt: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a records file and the run reading it must share (:func:`made_with`)."""
    return {"llm": llm, "max_new_tokens": max_new_tokens, **PROMPT_DEFAULTS, **prompt}


def _check_values(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Ids unique, labels 0 / 1, splits known, confidences in [0, 1]: one line naming the file, line and field."""
    seen: dict[str, int] = {}
    for line, record in enumerate(records, 2):  # line 1 is the header
        if record["id"] in seen:
            raise UserError(f"llm.records={path}: line {line} repeats id {record['id']!r} (first on line "
                            f"{seen[record['id']]}); expected one record per call")
        seen[record["id"]] = line
        for name, ok, expected in (("label", record["label"] in (0, 1) and not isinstance(record["label"], float),
                                    "0 or 1"),
                                   ("split", record["split"] in ("train", "validation", "test"),
                                    "train, validation or test"),
                                   ("raw_confidence", isinstance(record["raw_confidence"], (int, float))
                                    and 0 <= record["raw_confidence"] <= 1, "a number in [0, 1]")):
            if not ok:
                raise UserError(f"llm.records={path}: line {line} ({record['id']!r}) has {name}="
                                f"{record[name]!r}; expected {expected}")


def read_records_file(path: Path, dataset: str | None = None, needs: Sequence[str] = (),
                      splits: Mapping[str, str] | None = None, expect: Mapping[str, Any] | None = None) -> StageOutput:
    """A published records file as a stage output; every problem is one line naming the file.

    ``dataset``: the data set the run expects; ``expect``: what the run says produced it (the LLM, its
    ``max_new_tokens`` and every prompt setting: :func:`made_with`), checked against the header; ``needs``: record fields the requested view reads;
    ``splits``: the run's selection (id -> split), so ``dataset.apis`` / ``max_apis`` / ``max_per_api``
    pick from a file as they pick from the data set (None: every record).
    """
    if not path.is_file():
        raise UserError(f"llm.records={path}: no such file; expected a records file such as "
                        "experiments/records/ste-smollm2_135m.jsonl.gz")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            lines = [line for line in handle if line.strip()]
        header, records = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError, IndexError) as error:
        raise UserError(f"llm.records={path}: unreadable or truncated ({error.__class__.__name__}); "
                        "expected a gzipped JSON-lines records file written by `mice-exp records`") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise UserError(f"llm.records={path}: not a mice_exp records file (its first line has no "
                        f"\"format\": \"{FORMAT}\")")
    if len(records) != header.get("examples"):
        raise UserError(f"llm.records={path}: {len(records)} records but its header says {header.get('examples')}; "
                        "the file is truncated")
    if dataset is not None and header.get("dataset") != dataset:
        raise UserError(f"llm.records={path} holds {header.get('dataset')!r} calls; this run's dataset is "
                        f"{dataset!r} (expected a records file of the same data set)")
    found = made_with(header)
    for name, wanted in (expect or {}).items():
        if found.get(name) != wanted:
            setting = {"llm": "llm.name", "max_new_tokens": "llm.max_new_tokens"}.get(name, f"prompt.{name}")
            raise UserError(f"llm.records={path} was written with {name}={found[name]!r}; this run has "
                            f"{setting}={wanted!r} (expected a records file of the same {name}, or "
                            f"{setting}={found[name]!r})")
    for name in (*REQUIRED, *needs):
        missing = [n for n, r in enumerate(records, 2) if name not in r]
        if missing:
            raise UserError(f"llm.records={path}: {len(missing)} records lack {name!r} (first on line {missing[0]}), "
                            "which this run needs")
    _check_values(path, records)
    if splits is not None:
        records = _selected(path, records, splits, partial="actor_report" in header)
    sources = {name: [r.get("sources", {}).get(name) for r in records] for name in header.get("sources", [])}
    info = {k: header[k] for k in ("n_layers", "hidden_size", "llm", "dataset", "actor", "render") if k in header}
    info |= summarise(records)
    # keyed by the records' published fields, not their sources: adding a source to a file keeps its BERTScore cache
    key = f"records-{stable_hash([{k: r[k] for k in PUBLISHED if k in r} for r in records])}"
    return StageOutput(records=records, info=info, key=key, sources=sources)
