"""``mice-exp gate model=PATH_OR_URI input=QUERIES.jsonl [output=ANSWERS.jsonl]``: answer a batch of queries.

Prints one JSON answer per query on stdout (also written to ``output`` when given) and a short
summary on stderr. Other ``key=value`` arguments are Hydra overrides of the project config:
``llm=...`` / ``features=...`` (or their keys) say which pipeline the caller expects, and the gate
refuses one saved by another; ``risk=...`` decides at another risk setting; ``tracking.uri=...``
says where ``runs:/`` and ``models:/`` sources live.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Sequence

from mice_exp.errors import UserError, fail

USAGE = ("usage: mice-exp gate model=GATE_FOLDER|runs:/<run id>/gate|models:/<name>/<version> "
         "input=QUERIES.jsonl|- [output=ANSWERS.jsonl] [device=cpu|cuda] [batch_size=N] "
         "[llm=... features=... risk=... tracking.uri=...]")
GATE_KEYS = ("model", "input", "output", "device", "batch_size")


def _group(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0].split(".", 1)[0].split("@", 1)[0]


def summarize(answers: Sequence[dict], seconds: float, tau: float, risk: str) -> str:
    errors = sum(a["error"] is not None for a in answers)
    executed = sum(a["decision"] == "execute" for a in answers)
    unparseable = sum(a["parse_error"] is not None for a in answers)
    n = len(answers)
    return (f"gate: {n} queries in {seconds:.1f} s ({seconds / max(n, 1):.2f} s/query): execute {executed}, "
            f"abstain {n - errors - executed}, error {errors} (risk {risk}, tau={tau:g}; "
            f"{unparseable} calls unparseable)")


def gate(argv: Sequence[str]) -> None:
    from mice_exp.compose import as_plain, compose_config, wants_help

    if wants_help(argv):
        print(USAGE)
        return
    from mice_exp.config import check_config
    from mice_exp.gate.gate import Gate
    from mice_exp.gate.queries import read_queries
    from mice_exp.llm.precision import resolve_dtype
    from mice_exp.cache import write_text
    from mice_exp.paths import paths_from, writable_file

    opts: dict[str, str] = {}
    overrides: list[str] = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or not key:
            raise UserError(f"{arg!r} is not key=value; {USAGE}")
        if key in GATE_KEYS:
            opts[key] = value
        else:
            overrides.append(arg)
    missing = [k for k in ("model", "input") if not opts.get(k)]
    if missing:
        raise UserError(f"{' and '.join(missing)} missing; {USAGE}")
    if opts.get("batch_size") and not opts["batch_size"].isdigit():
        raise UserError(f"batch_size={opts['batch_size']!r}; expected a positive integer")
    cfg = as_plain(compose_config(overrides))
    check_config(cfg)  # the values a gate uses (risk, llm, features) fail as in the main command
    cfg["llm"]["dtype"] = resolve_dtype(cfg["llm"]["dtype"], cfg["llm"]["device"])  # as the run that saved it
    groups = {_group(o) for o in overrides}
    given = {o.split("=", 1)[0] for o in overrides}
    device = opts.get("device") or (cfg["llm"]["device"] if "llm.device" in given else None)
    batch = opts.get("batch_size") or (cfg["llm"]["batch_size"] if "llm.batch_size" in given else None)
    paths = paths_from(cfg["paths"])
    items, places = read_queries(opts["input"])  # a missing file fails before anything loads
    output = writable_file(opts["output"], Path.cwd(), "output", bool(cfg.get("force"))) if "output" in opts else None
    start = time.perf_counter()
    loaded = Gate.load(opts["model"], expect=cfg, parts=[p for p in ("llm", "features") if p in groups],
                       device=device, batch_size=int(batch) if batch else None,
                       models=paths.models, tracking=cfg["tracking"], root=paths.root)
    loaded_s = time.perf_counter() - start
    if "risk" in groups:
        loaded.set_risk(cfg["risk"])
    print(f"gate: {loaded.describe()}", file=sys.stderr)
    answers = loaded.decide(items, places)
    lines = [json.dumps(a, ensure_ascii=False) for a in answers]
    if output is not None:
        write_text(output, "".join(line + "\n" for line in lines))
    for line in lines:
        print(line)
    print(summarize(answers, time.perf_counter() - start, loaded.tau, loaded.spec["risk"]["name"]), file=sys.stderr)
    steps = {"load gate": loaded_s, "LLM load + retrieval + prompts": loaded.timing.get("prepare_s", 0.0),
             "generation": loaded.timing.get("generate_s", 0.0),
             "features + estimator": loaded.timing.get("features_s", 0.0)}
    print("gate: time " + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items()), file=sys.stderr)


def main() -> None:
    """``python -m mice_exp.gate ARGS`` (the same as ``mice-exp gate ARGS``)."""
    try:
        gate(sys.argv[1:])
    except UserError as error:
        fail(error)
