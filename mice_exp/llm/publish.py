"""``mice-exp records``: publish an LLM stage (and its confidence sources) as a small records file.

The file is what lets anyone rebuild every table without the LLM (``llm.records=<file>``) and
what carries days of LLM work across machines: records only, no activations, no pickle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mice_exp.cache import read_json_if
from mice_exp.errors import UserError
from mice_exp.llm.records import publishable, read_records_file, read_records_header, read_stage, write_records_file
from mice_exp.llm.sources import stage_sources
from mice_exp.llm.stage import LLMStage
from mice_exp.tracking.gitinfo import git_tags


def default_path(stage: LLMStage) -> Path:
    """``experiments/records/<dataset>-<llm>.jsonl.gz``."""
    return stage.paths.root / "experiments" / "records" / f"{stage.dataset.name}-{stage.llm.name}.jsonl.gz"


def publish_records(stage: LLMStage, sources: Mapping[str, Any], path: Path | None = None) -> Path:
    """Write the LLM stage's records (computing or resuming the stage if needed), or those of the records file
    it reads (``llm.records``), with every source in ``sources.use`` (``sources``: conf/sources; computed if
    missing, which loads the LLM) beside the sources the file already holds. Torch is imported only once
    there is work for it: a records file from another LLM or data set is refused in a second, not after the
    import."""
    if stage.records_path is not None:
        output = read_records_file(stage.records_path, stage.dataset.name, expect=stage.made_with())
        header = read_records_header(stage.records_path)
    else:
        out = stage.run()
        output = read_stage(out)
        header = {"dataset": stage.dataset.name, "llm": stage.llm.name, "display": stage.llm.display,
                  "n_layers": output.info["n_layers"], "hidden_size": output.info["hidden_size"],
                  "stage_key": read_json_if(out / "meta.json"), "stage_cache": out.name}
    names = list(sources["use"])
    computed: dict[str, Any] = {}
    if names:
        computed = stage_sources(sources, stage, output, names)
    values = {n: [None if v != v else float(v) for v in vals] for n, vals in computed.items()}  # NaN -> null
    values = {n: v for n, v in output.sources.items() if n not in values} | values
    records = [publishable(r) | ({"sources": {n: values[n][i] for n in values}} if values else {})
               for i, r in enumerate(output.records)]
    what = ("sources " + ", ".join(computed) if computed else "a copy" if stage.records_path else "the stage")
    header = {k: v for k, v in header.items() if k not in ("format", "version")} | {
        "examples": len(records), "sources": list(values), "written_by": written_by(header, stage.paths.root, what)}
    path = path or default_path(stage)
    try:
        write_records_file(path, header, records)
    except OSError as error:  # a full disk, a quota: the write is atomic, so the folder is as it was
        kept = "the file already there is unchanged" if path.exists() else "no partial file is left"
        raise UserError(f"output={path}: could not be written ({error.strerror or error}); {kept}, and the stage "
                        "and its sources stay cached, so the same command writes it without generating again; "
                        "expected a folder with room for it (free some space or pass output=ELSEWHERE)") from None
    return path


def written_by(header: dict[str, Any], root: Path, what: str) -> list[dict[str, Any]]:
    """The commits that wrote a records file, oldest first, each with what it wrote (the stage, sources, a
    copy); a file from before this field starts its list at its next write."""
    tags = git_tags(root)
    return [*header.get("written_by", []), {"commit": tags.get("git.commit"), "dirty": tags["git.dirty"], "wrote": what}]
