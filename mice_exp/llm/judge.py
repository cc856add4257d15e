"""Actors' calls judged by an LLM: each call rendered in the one canonical layout and teacher-forced after the
judge's own prompt for its query, the prompt's prefill shared by every actor's call on that query.

A query's prompt (the judge's template, its 8 retrieved training-split demonstrations, the query) is the same
whichever actor answered it; only the reply differs. So per query the prefill runs once into a KV cache and
the K actors' calls follow it (:meth:`~mice_exp.llm.teacher.Teacher.score_shared`; vLLM's prefix cache on the
engine), and since calls are rendered canonically (:meth:`~mice_exp.llm.toolcall.CallFormat.canonical`), actors
that made the same call (most right ones) are one reply, scored once. The judged rows are kept per query in
``<cache>/llm/<judge>-judges-<key>/<query hash>.jsonl``, one per canonical reply, whichever actors asked for it:
a later run with more actors scores only the replies not yet there, and an interrupted one resumes.

The sources that ask about the call itself (``sources.use=[p_true]``: the judge's P(True) of the given call, the
LLM-as-judge baseline) are asked after the judged rows, per query from one prefill of the follow-ups' shared prefix,
and kept beside them in ``source-<name>-<key>/<query hash>.jsonl`` (the folders a stage's sources use).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

from filelock import FileLock
from tqdm.auto import tqdm

from mice_exp.cache import read_intact, read_json, read_jsonl, stable_hash, write_json, write_jsonl
from mice_exp.devices import resolve_device
from mice_exp.errors import UserError
from mice_exp.llm.actors import Actor, actor_from_records, actor_names, actor_path, read_actor
from mice_exp.llm.publish import written_by
from mice_exp.llm.records import Record, publishable, read_records_file, read_records_header, write_records_file
from mice_exp.llm.sources import about_the_call, given_call_values, record_prompts, source_folders
from mice_exp.llm.stage import LLMStage

#: How every judged call is written before teacher forcing (:func:`~mice_exp.llm.toolcall.canonical_json`).
RENDER = "canonical"
JUDGE_VERSION = 1
log = logging.getLogger(__name__)


def judge_folder(stage: LLMStage) -> tuple[Path, dict[str, Any]]:
    """Where ``stage``'s LLM keeps the calls it judged, and its key: everything that changes a judged row (the
    stage's own key: data set, prompt, LLM, retrieval, device) and the rendering."""
    key = stage.key(resolve_device(stage.llm.device).type) | {"render": RENDER, "judge_version": JUDGE_VERSION}
    return stage.paths.llm / f"{stage.llm.name}-judges-{stable_hash(key)}", key


def judge_actors(stage: LLMStage, actors: Sequence[Actor], sources: Mapping[str, Any] | None = None,
                 published: Path | None = None) -> dict[str, tuple[dict[str, Any], list[Record]]]:
    """Each actor's judged calls (those it made on the run's selection) as a records file's header and records:
    every field a feature view reads is the judge's (each layer's lens string and raw confidence = the judge's
    probability of the call's content tokens, for the call in canonical layout), the parsed call and label
    the actor's, and the judge's answers to ``sources.use`` (``sources``: conf/sources) about the call. Records
    keep the actor file's order; the header names ``actor``, ``judge`` and ``render``. Judged records files in
    ``published`` made with the same settings stand in for the calls they hold (:func:`_seed`)."""
    examples = {e.id: e for e in stage.selection.examples}
    fmt = stage.prompt.fmt
    wanted: dict[str, dict[str, None]] = {}
    for actor in actors:
        for call in actor.judged():
            if call.id in examples:
                wanted.setdefault(call.id, {})[fmt.canonical(call.api, call.args)] = None
    out, key = judge_folder(stage)
    for actor in actors if published is not None else ():
        _seed(out, fmt, judged_path(published, stage.dataset.name, actor.name, stage.llm.name))
    names = about_the_call((sources or {}).get("use") or [])
    judged = _judge(stage, out, examples, {i: list(r) for i, r in wanted.items()}, sources or {}, names)
    shapes = read_json(out / "shapes.json") if (out / "shapes.json").exists() else {}
    judge = stage.llm.name
    results = {}
    for actor in actors:
        calls = [c for c in actor.judged() if c.id in examples]
        rows = [judged[c.id][fmt.canonical(c.api, c.args)] for c in calls]
        records = [publishable(row) | {"pred_api": c.api, "pred_args": c.args, "parse_error": None, "label": c.label}
                   | ({"sources": {n: row["sources"][n] for n in names}} if names else {}) for row, c in zip(rows, calls)]
        report = actor.report()
        info = {"dataset": stage.dataset.name, "llm": judge, **shapes, "stage_key": key,
                "display": f"{actor.name} judged by {stage.llm.title}", "actor": actor.name,
                "judge": judge, "render": RENDER, "actor_records": {"file": actor.source.name, "key": actor.key},
                "actor_report": report, "examples": len(records), "sources": names, "stage_cache": out.name,
                "written_by": written_by({}, stage.paths.root, f"{actor.name}'s calls judged by {judge}")}
        results[actor.name] = (info, records)
    return results


def _judge(stage: LLMStage, out: Path, examples: dict[str, Any], wanted: dict[str, list[str]],
           settings: Mapping[str, Any], names: Sequence[str]) -> dict[str, dict[str, Record]]:
    """Every wanted (query, canonical reply)'s judged record with its named sources under ``"sources"``, those
    not in ``out`` yet computed, query by query."""
    out.mkdir(parents=True, exist_ok=True)
    folders = source_folders(names, settings, stage.prompt, out, stage.backend.source_method)
    done: dict[str, dict[str, Record]] = {}
    for i in wanted:
        _read(out, folders, i, done)
    todo = [i for i in wanted if any(t not in done[i] or len(done[i][t]["sources"]) < len(names) for t in wanted[i])]
    if not todo:
        return done
    with FileLock(str(out / ".lock")):
        teacher = stage.backend.teacher()
        write_json(out / "shapes.json", {"n_layers": teacher.n_layers, "hidden_size": teacher.hidden_size})
        runner = stage.runner(teacher.tokenizer)
        demos = stage.demos(out)
        splits = stage.selection.splits
        pending = sum(len(wanted[i]) - sum(t in done[i] for t in wanted[i]) for i in todo)
        log.info("%s judges %d calls (and asks %s) on %d queries into %s", stage.llm.name, pending,
                 ", ".join(names) or "no source", len(todo), out)
        bar = tqdm(total=len(todo), desc=f"{stage.llm.name} judges", unit="query")
        asker = stage.backend.source_runner() if names else None
        for i in todo:
            _read(out, folders, i, done)  # another process may have judged it meanwhile
            missing = [t for t in wanted[i] if t not in done[i]]
            if missing:
                prompt = runner.prompt(examples[i], [examples[d] for d in demos[i]])
                new = runner.force_shared(teacher, examples[i], splits[i], prompt, missing)
                for text, row in zip(missing, new):
                    if row["text"] != text:
                        log.warning("%s: %s's tokens of the call decode to %r, not %r", i, stage.llm.name,
                                    row["text"][:80], text[:80])
                    done[i][text] = row | {"reply": text, "sources": {}}
                write_jsonl(_file(out, i), [{k: v for k, v in r.items() if k != "sources"} for r in done[i].values()])
            for name, folder in folders.items():
                asked = [t for t in wanted[i] if name not in done[i][t]["sources"]]
                if asked:
                    prompts = [record_prompts(runner.builder, examples, demos, done[i][t]) for t in asked]
                    for text, value in zip(asked, given_call_values(asker, settings, stage.llm, prompts, [name])):
                        done[i][text]["sources"][name] = value[name]
                    write_jsonl(_file(folder, i), [{"reply": t, "value": r["sources"][name]}
                                                   for t, r in done[i].items() if name in r["sources"]])
            bar.update()
        bar.close()
    return done


def _seed(out: Path, fmt: Any, path: Path) -> None:
    """The judged rows of a records file published from ``out``'s settings (its header's ``stage_cache``), put in
    ``out`` where it lacks them: a source asked later (``sources.use=[p_true]``) then judges no call again, and the
    records it writes keep the published rows, on another machine or after the cache is gone."""
    header = read_records_header(path) if path.is_file() else {}
    if header.get("stage_cache") != out.name:
        return
    judged = read_records_file(path, header["dataset"])
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "shapes.json").exists():
        write_json(out / "shapes.json", {k: judged.info[k] for k in ("n_layers", "hidden_size")})
    queries: dict[str, dict[str, Record]] = {}
    for r in judged.records:
        row = {k: v for k, v in r.items() if k != "sources"}
        queries.setdefault(r["id"], {})[fmt.canonical(r["pred_api"], r["pred_args"])] = row
    for query, rows in queries.items():
        held = {r["reply"]: r for r in read_intact(_file(out, query), read_jsonl) or []}
        new = {reply: row | {"reply": reply} for reply, row in rows.items() if reply not in held}
        if new:
            write_jsonl(_file(out, query), [*held.values(), *new.values()])


def _file(folder: Path, query: str) -> Path:
    return folder / f"{stable_hash(query, 20)}.jsonl"


def _read(out: Path, folders: Mapping[str, Path], query: str, done: dict[str, dict[str, Record]]) -> None:
    """A query's judged rows and their sources' values, as far as ``out`` holds them, into ``done[query]``."""
    done[query] = {r["reply"]: r | {"sources": {}} for r in read_intact(_file(out, query), read_jsonl) or []}
    for name, folder in folders.items():
        for r in read_intact(_file(folder, query), read_jsonl) or []:
            if r["reply"] in done[query]:
                done[query][r["reply"]]["sources"][name] = r["value"]


def resolve_actors(stage: LLMStage, spec: str, folder: Path, root: Path) -> list[Actor]:
    """``actor=``'s value as actors for ``stage``'s LLM to judge: comma-separated names (files
    ``<folder>/NAME.json``; ``all``: every file in ``folder``) and paths (relative to ``root``: an actor file, or
    an LLM's records file ``*.jsonl.gz`` written with the stage's data set and prompt settings)."""
    every = {e.id: e for e in stage.dataset.load(stage.paths)}
    names = [n for s in spec.split(",") if s.strip() for n in (actor_names(folder) if s.strip() == "all" else [s.strip()])]
    if not names:
        raise UserError(f"actor={spec!r} names no actor; expected NAME[,NAME...] or all (the files of {folder})")
    actors = []
    for name in names:
        path = actor_path(name, folder, root)
        if not path.name.endswith(".jsonl.gz"):
            actors.append(read_actor(path, every))
            continue
        header = read_records_header(path) if _gzipped(path) else {}
        _refuse_judged(path, header)
        settings = {k: v for k, v in stage.made_with().items() if k != "llm"}
        records = read_records_file(path, stage.dataset.name, expect=settings).records
        actors.append(actor_from_records(path, records, str(header.get("llm"))))
    return actors


def _refuse_judged(path: Path, header: dict[str, Any]) -> None:
    """A judged records file is no actor: its calls' fields are already another LLM's judgement."""
    if header.get("judge") is not None:
        raise UserError(f"actor={path} is already a judged records file ({header.get('actor')} judged by "
                        f"{header['judge']}); expected an LLM's own records or an actor file")


def _gzipped(path: Path) -> bool:
    """Whether ``path`` starts as a gzip file does (a text file named ``.jsonl.gz`` is refused by the reader)."""
    with open(path, "rb") as handle:
        return handle.read(2) == b"\x1f\x8b"


def judged_path(folder: Path, dataset: str, actor: str, judge: str) -> Path:
    """``<folder>/<dataset>-<actor>-judged-by-<judge>.jsonl.gz``: where an actor's judged records are published."""
    return folder / f"{dataset}-{actor}-judged-by-{judge}.jsonl.gz"


def publish_judged(stage: LLMStage, actors: Sequence[Actor], folder: Path,
                   sources: Mapping[str, Any] | None = None) -> list[Path]:
    """Every actor's judged records (:func:`judge_actors`, all actors' calls on a query scored after one prefill),
    one records file each in ``folder`` (:func:`judged_path`)."""
    paths = []
    for name, (header, records) in judge_actors(stage, actors, sources, folder).items():
        path = judged_path(folder, stage.dataset.name, name, stage.llm.name)
        write_records_file(path, header, records)
        paths.append(path)
    return paths
