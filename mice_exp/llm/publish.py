"""``mice-exp records``: publish an LLM stage (and its confidence sources) as a small records file.

The file is what lets anyone rebuild every table without the LLM (``llm.records=<file>``) and
what carries days of LLM work across machines: records only, no activations, no pickle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mice_exp.cache import read_json_if
from mice_exp.llm.records import (publishable, read_records_file, read_records_header, read_stage, records_expect,
                                  write_records_file)
from mice_exp.paths import paths_from, resolve


def default_path(cfg: Mapping[str, Any], root: Path) -> Path:
    """``experiments/records/<dataset>-<llm>.jsonl.gz``."""
    return root / "experiments" / "records" / f"{cfg['dataset']['name']}-{cfg['llm']['name']}.jsonl.gz"


def publish_records(cfg: Mapping[str, Any], path: Path | None = None) -> Path:
    """Write the configured LLM stage's records (computing or resuming the stage if needed), or those of
    the records file ``llm.records``, with every source in ``sources.use`` (computed if missing, which
    loads the LLM) beside the sources the file already holds. Torch is imported only once there is work
    for it: a records file from another LLM or data set is refused in a second, not after the import."""
    paths = paths_from(cfg["paths"])
    if cfg["llm"].get("records"):
        stage = read_records_file(resolve(cfg["llm"]["records"], paths.root), cfg["dataset"]["name"],
                                  expect=records_expect(cfg))
        header = read_records_header(resolve(cfg["llm"]["records"], paths.root))
    else:
        from mice_exp.llm.stage import run_llm_stage

        out = run_llm_stage(cfg, paths)
        stage = read_stage(out)
        header = {"dataset": cfg["dataset"]["name"], "llm": cfg["llm"]["name"], "display": cfg["llm"]["display"],
                  "n_layers": stage.info["n_layers"], "hidden_size": stage.info["hidden_size"],
                  "stage_key": read_json_if(out / "meta.json"), "stage_cache": out.name}
    names = list(cfg["sources"]["use"])
    computed: dict[str, Any] = {}
    if names:
        from mice_exp.llm.sources import stage_sources

        computed = stage_sources(cfg, paths, stage, names)
    values = {n: [None if v != v else float(v) for v in vals] for n, vals in computed.items()}  # NaN -> null
    values = {n: v for n, v in stage.sources.items() if n not in values} | values
    records = [publishable(r) | ({"sources": {n: values[n][i] for n in values}} if values else {})
               for i, r in enumerate(stage.records)]
    what = ("sources " + ", ".join(computed) if computed else "a copy" if cfg["llm"].get("records") else "the stage")
    header = {k: v for k, v in header.items() if k not in ("format", "version")} | {
        "examples": len(records), "sources": list(values), "written_by": written_by(header, paths.root, what)}
    path = path or default_path(cfg, paths.root)
    write_records_file(path, header, records)
    return path


def written_by(header: dict[str, Any], root: Path, what: str) -> list[dict[str, Any]]:
    """The commits that wrote a records file, oldest first, each with what it wrote (the stage, sources, a
    copy); a file from before this field starts its list at its next write."""
    from mice_exp.tracking.gitinfo import git_tags

    tags = git_tags(root)
    return [*header.get("written_by", []), {"commit": tags.get("git.commit"), "dirty": tags["git.dirty"], "wrote": what}]
