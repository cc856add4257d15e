"""``mice-exp gate model=PATH_OR_URI input=QUERIES.jsonl [output=ANSWERS.jsonl]``: answer a batch of queries;
``mice-exp serve model=PATH_OR_URI``: answer an OpenAI client (:mod:`mice_exp.gate.app`).

Prints one JSON answer per query on stdout (also written to ``output`` when given) and a short
summary on stderr. Other ``key=value`` arguments are Hydra overrides of the project config:
``llm=...`` / ``features=...`` (or their keys) say which pipeline the caller expects, and the gate
refuses one saved by another; ``risk=...`` decides at another risk setting; ``tracking.uri=...``
says where ``runs:/`` and ``models:/`` sources live.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

from mice_exp.cache import write_text
from mice_exp.compose import as_plain, compose_config, wants_help
from mice_exp.config import check_config
from mice_exp.errors import UserError, fail, interrupt_on_sigterm
from mice_exp.gate.artifact import ENGINE_SETTINGS, risk_entry
from mice_exp.gate.chat import InvalidRequest, check_tau
from mice_exp.gate.gate import Gate
from mice_exp.gate.policy import ToolRisk, check_on_abstain
from mice_exp.gate.queries import read_queries
from mice_exp.llm.settings import LLMSettings
from mice_exp.paths import paths_from, writable_file

USAGE = ("usage: mice-exp gate model=GATE_FOLDER|runs:/<run id>/gate|models:/<name>/<version> "
         "input=QUERIES.jsonl|- [output=ANSWERS.jsonl] [device=cpu|cuda] [batch_size=N] "
         "[llm=... features=... risk=... tracking.uri=...]")
GATE_KEYS = ("model", "input", "output", "device", "batch_size")


def usage_hint(where: str, tracking_uri: str | None) -> str:
    """The ``mice-exp gate`` and ``serve`` commands for a saved gate, runnable as printed from any folder: a
    ``runs:/`` or ``models:/`` source is named with the MLflow store it lives in (``tracking_uri``, absolute)."""
    store = [f"tracking.uri={tracking_uri}"] if tracking_uri and where.startswith(("runs:/", "models:/")) else []
    return (f"{shlex.join(['mice-exp', 'gate', f'model={where}', *store, 'input=queries.jsonl'])}; "
            f"{shlex.join(['mice-exp', 'serve', f'model={where}', *store])}")


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


def parse_options(argv: Sequence[str], keys: Sequence[str], required: Sequence[str],
                  usage: str) -> tuple[dict[str, str], list[str], dict]:
    """A gate command's own ``key=value`` options, its Hydra overrides and the config they compose (checked as
    the main command checks it)."""
    opts: dict[str, str] = {}
    overrides: list[str] = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or not key:
            raise UserError(f"{arg!r} is not key=value; {usage}")
        if key in keys:
            opts[key] = value
        else:
            overrides.append(arg)
    missing = [k for k in required if not opts.get(k)]
    if missing:
        raise UserError(f"{' and '.join(missing)} missing; {usage}")
    if "batch_size" in opts and not (opts["batch_size"].isdigit() and int(opts["batch_size"]) > 0):
        raise UserError(f"batch_size={opts['batch_size']!r}; expected a positive integer")
    cfg = as_plain(compose_config(overrides))
    check_config(cfg)  # the values a gate uses (risk, llm, features) fail as in the main command
    cfg = {**cfg, "llm": LLMSettings.from_config(cfg["llm"]).pinned().as_dict()}  # as the run that saved it
    return opts, overrides, cfg


def load_gate(opts: dict[str, str], overrides: Sequence[str], cfg: dict) -> Gate:
    """The gate ``model=`` names, refused if the overrides name another LLM or feature view; ``risk=`` decides
    at that risk setting."""
    groups = {_group(o) for o in overrides}
    given = {o.split("=", 1)[0] for o in overrides}
    llm = LLMSettings.from_config(cfg["llm"])
    device = opts.get("device") or (llm.device if "llm.device" in given else None)
    batch = opts.get("batch_size") or (llm.batch_size if "llm.batch_size" in given else None)
    engine = {key: getattr(llm, key) for key in ENGINE_SETTINGS if f"llm.{key}" in given}  # e.g. llm.backend=vllm
    paths = paths_from(cfg["paths"])
    loaded = Gate.load(opts["model"], expect=cfg, parts=[p for p in ("llm", "features") if p in groups],
                       device=device, batch_size=int(batch) if batch else None, engine=engine,
                       models=paths.models, tracking=cfg["tracking"], root=paths.root)
    if "risk" in groups:
        loaded.set_risk(cfg["risk"])
    return loaded


def gate(argv: Sequence[str]) -> None:
    if wants_help(argv):
        print(USAGE)
        return

    opts, overrides, cfg = parse_options(argv, GATE_KEYS, ("model", "input"), USAGE)
    items, places = read_queries(opts["input"])  # a missing file fails before anything loads
    output = writable_file(opts["output"], Path.cwd(), "output", bool(cfg.get("force"))) if "output" in opts else None
    start = time.perf_counter()
    loaded = load_gate(opts, overrides, cfg)
    loaded_s = time.perf_counter() - start
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


SERVE_USAGE = ("usage: mice-exp serve model=GATE_FOLDER|runs:/<run id>/gate|models:/<name>/<version> [port=8000] "
               "[on_abstain=confirm|refuse|pass] [name=MODEL_NAME] [max_queue=64] [batch_size=N] [device=cpu|cuda] "
               "[tool_taus=NAME:TAU,...] [llm=... features=... risk=... tracking.uri=...]\n"
               "serves the gate as an OpenAI-compatible POST /v1/chat/completions (with tools), "
               "POST /v1/tool_calls/check and GET /v1/models on 127.0.0.1")
SERVE_KEYS = ("model", "port", "on_abstain", "name", "max_queue", "device", "batch_size", "tool_taus")


def tool_risk(spec: str) -> ToolRisk:
    """The per-tool thresholds of ``tool_taus=NAME:TAU,...`` with the high- and low-risk taus of ``conf/risk``."""
    taus = {}
    for item in filter(None, spec.split(",")):
        name, sep, value = item.rpartition(":")
        try:
            taus[name] = check_tau(float(value)) if sep and name else None
        except (ValueError, InvalidRequest):
            taus[name] = None
        if taus[name] is None:
            raise UserError(f"tool_taus: {item!r}; expected NAME:TAU pairs with TAU in [0, 1], comma-separated")
    high, low = (risk_entry(as_plain(compose_config([f"risk={r}"]))["risk"])["tau"] for r in ("high", "low"))
    return ToolRisk(high=high, low=low, tools=taus)


def serve(argv: Sequence[str]) -> None:
    """``mice-exp serve model=...``: the gate as an OpenAI-compatible endpoint (:mod:`mice_exp.gate.app`)."""
    if wants_help(argv):
        print(SERVE_USAGE)
        return
    from mice_exp.gate.app import check_port, open_server  # loads fastapi, starlette

    opts, overrides, cfg = parse_options(argv, SERVE_KEYS, ("model",), SERVE_USAGE)
    if "max_queue" in opts and not opts["max_queue"].isdigit():
        raise UserError(f"max_queue={opts['max_queue']!r}; expected a non-negative integer")
    port = check_port(opts.get("port", 8000))  # all refused before the LLM loads
    on_abstain = check_on_abstain(opts.get("on_abstain", "confirm"))
    risk = tool_risk(opts.get("tool_taus", ""))
    loaded = load_gate(opts, overrides, cfg)  # a missing or untrusted gate is refused here, before the port opens
    print(f"serve: {loaded.describe()}", file=sys.stderr)
    server = open_server(loaded, model=opts.get("name"), port=port, on_abstain=on_abstain,  # a busy port: refused
                         max_queue=max(1, int(opts.get("max_queue", 64))), risk=risk)  # before the LLM loads
    interrupt_on_sigterm()  # a stop ends serving through the exit handlers (a vLLM engine's core with them)
    start = time.perf_counter()
    try:
        loaded.warm()
        print(f"serve: {server.service.model} on {server.url} (on_abstain={on_abstain}; LLM loaded in "
              f"{time.perf_counter() - start:.1f} s); Ctrl-C stops", file=sys.stderr, flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        print("serve: stopped", file=sys.stderr)
    finally:
        server.server_close()


def main() -> None:
    """``python -m mice_exp.gate ARGS`` (the same as ``mice-exp gate ARGS``)."""
    try:
        gate(sys.argv[1:])
    except UserError as error:
        fail(error)
