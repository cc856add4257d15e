"""``mice-exp records``: publish an LLM stage (and its confidence sources) as a small records file.

The file is what lets anyone rebuild every table without the LLM (``llm.records=<file>``) and
what carries days of LLM work across machines: records only, no activations, no pickle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mice_exp.cache import read_json_if
from mice_exp.llm.records import publishable, read_stage, write_records_file
from mice_exp.paths import paths_from


def default_path(cfg: Mapping[str, Any], root: Path) -> Path:
    """``experiments/records/<dataset>-<llm>.jsonl.gz``."""
    return root / "experiments" / "records" / f"{cfg['dataset']['name']}-{cfg['llm']['name']}.jsonl.gz"


def publish_records(cfg: Mapping[str, Any], path: Path | None = None) -> Path:
    """Write the configured LLM stage's records (computing or resuming the stage if needed) with
    every source in ``sources.use`` (computed if missing, which loads the LLM)."""
    from mice_exp.data import select_examples
    from mice_exp.llm.model import load_llm
    from mice_exp.llm.sources import compute_source, load_source
    from mice_exp.llm.stage import run_llm_stage

    paths = paths_from(cfg["paths"])
    out = run_llm_stage(cfg, paths)
    stage = read_stage(out)
    names = list(cfg["sources"]["use"])
    values: dict[str, Any] = {}
    if names:
        examples = {e.id: e for e in select_examples(cfg["dataset"], paths).examples}
        llm = load_llm(cfg["llm"], paths.models)
        for name in names:
            folder = compute_source(name, cfg, out, examples, stage.records, llm)
            values[name] = [None if v != v else float(v) for v in load_source(folder, stage.ids)]  # NaN -> null
    records = [publishable(r) | ({"sources": {n: values[n][i] for n in names}} if names else {})
               for i, r in enumerate(stage.records)]
    header = {"dataset": cfg["dataset"]["name"], "llm": cfg["llm"]["name"], "display": cfg["llm"]["display"],
              "n_layers": stage.info["n_layers"], "hidden_size": stage.info["hidden_size"],
              "examples": len(records), "sources": names, "stage_key": read_json_if(out / "meta.json"),
              "stage_cache": out.name}
    path = path or default_path(cfg, paths.root)
    write_records_file(path, header, records)
    return path
