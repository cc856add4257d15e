"""Sub-commands of ``mice-exp`` besides the Hydra app (they compose the same configs)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable, Sequence

from mice_exp.compose import as_plain, compose_config, wants_help
from mice_exp.errors import UserError
from mice_exp.hosts.claude_hooks import HOOK_TIMEOUT, GateHook, command
from mice_exp.launcher.slurm_cluster import missing_client
from mice_exp.paths import project_root, resolve, writable_file
from mice_exp.report.arguments import parse_args

USAGE = """usage: mice-exp [-m] [key=value ...]         run the configured experiment (a sweep with -m)
       mice-exp inspect EXAMPLE [key=value ...] per-layer logit-lens strings of one example
       mice-exp gate model=... input=...        calibrated execute / abstain decisions for new queries
       mice-exp serve model=... [port=8000]     the gate as an OpenAI-compatible endpoint on 127.0.0.1
       mice-exp report [--sweep DIR] [...]      paper tables and figures from the finished MLflow runs
       mice-exp records [output=FILE] [...]     publish the LLM stage as a records file (llm.records=FILE)
       mice-exp mcq [template=plain|chat] [...] each candidate answer's log-likelihood (dataset=when2call)
       mice-exp ui [key=value ...]              the MLflow runs table (link printed, local store served)
       mice-exp claude-hook gate=URL [...]      a Claude Code PreToolUse hook: the hook JSON in, the decision out

Each subcommand takes -h / --help. The config groups and their options are below; a run's resolved
config: `mice-exp --cfg job [key=value ...]`; Hydra's own flags (--cfg, --info, --multirun, ...):
`mice-exp --hydra-help`."""
INSPECT_USAGE = """usage: mice-exp inspect EXAMPLE_ID_OR_INDEX [hydra overrides]
prints, for one call of the configured LLM stage (MICE Figure 2), the string every layer's logit lens decodes
and the final output last, with the call's label and raw confidence. EXAMPLE is a call id (ste/<api>/<n>) or an
index into the run's calls sorted by id; the stage is computed or read from its cache, or from llm.records=FILE
(then no LLM runs: seconds). An id outside the selection is one line naming one that is in it.
examples:
  mice-exp inspect "ste/BART%%Advisory information/3" dataset.max_apis=3   # the stage make run cached
  mice-exp inspect "ste/add_date/3" llm.records=experiments/records/ste-smollm2_135m.jsonl.gz"""
UI_USAGE = ("usage: mice-exp ui [hydra overrides, e.g. tracking.uri=...]\n"
            "prints the link to the runs table (Table-1 metrics as columns) and serves the local store on "
            "127.0.0.1:5000")
RECORDS_USAGE = ("usage: mice-exp records [output=FILE] [hydra overrides]\n"
                 "writes the configured LLM stage (computed or resumed if needed) and its sources.use as a\n"
                 "records file, by default experiments/records/<dataset>-<llm>.jsonl.gz; any run takes it\n"
                 "back with llm.records=FILE and needs no LLM. With llm.records=FILE it adds sources.use to\n"
                 "that file's records (loading the LLM, not re-running its stage). With llm.shards=N llm.shard=i\n"
                 "it runs worker i of the stage; the worker that completes the stage writes the file.\n"
                 "With actor=NAME[,NAME...] or actor=all (conf/actors: ../shared/data/ste_actors/NAME.json; or an\n"
                 "actor file's or another LLM's records file's path) it writes the configured LLM's judgement of\n"
                 "those calls (each rendered canonically and teacher-forced as the reply to the LLM's own prompt),\n"
                 "one file per actor in output=DIR, by default experiments/records/actors/")

MCQ_USAGE = ("usage: mice-exp mcq [template=plain|chat] [output=FILE] [hydra overrides]\n"
             "scores each candidate answer of a multiple-choice data set (dataset=when2call) under the configured\n"
             "LLM as lm-eval-harness does (summed token log-likelihoods; template=plain: When2Call's task as it is,\n"
             "chat: with the LLM's chat template) and writes them, by default to\n"
             "experiments/<dataset>/mcq-<llm>-<template>.json; an interrupted run resumes from its cache")

CLAUDE_HOOK_USAGE = ("usage: mice-exp claude-hook gate=URL [tools=FILE] [tau=T] [timeout=S] [fail_open=true]\n"
                     "                            [trusted=allow|defer]\n"
                     "a Claude Code PreToolUse command hook: reads the hook's JSON on stdin, asks the gate at URL\n"
                     "(mice-exp serve) about the call and prints the decision JSON (deny or ask with the gate's\n"
                     "probability; allow, or no decision with trusted=defer). tools=FILE: a JSON list of OpenAI tool\n"
                     "schemas the gate is shown (a tool not in it is shown with the call's own arguments). A gate\n"
                     "that gives no verdict within timeout=S seconds (default 50; keep it below the hook's own\n"
                     "timeout) denies the call, unless fail_open=true. See docs/hosts.md.")


def usage() -> str:
    """``mice-exp --help``: the commands, then every config group of ``conf/`` with its options (Hydra's own help
    lists only its ``hydra/*`` groups, as the app's groups sit behind this entrypoint's own ``--help``)."""
    return f"{USAGE}\n\n{config_groups()}"


def config_groups(conf: Path | None = None, width: int = 110) -> str:
    """Each group of ``conf`` (default: the project's) with its options, read from the folders so that a new file is
    listed without a word here; the default marked ``*``, groups outside the defaults list with Hydra's ``+``."""
    from omegaconf import OmegaConf

    conf = conf or project_root() / "conf"
    listed = OmegaConf.to_container(OmegaConf.load(conf / "config.yaml")).get("defaults", [])
    defaults = {group: option for entry in listed if isinstance(entry, dict)
                for group, option in entry.items() if "@" not in group}  # not estimator@baselines.*
    groups: dict[str, list[str]] = {}
    for folder in sorted(p for p in conf.rglob("*") if p.is_dir() and any(p.glob("*.yaml"))):
        group = folder.relative_to(conf).as_posix()
        groups[group if group in defaults or group.startswith("hydra/") else f"+{group}"] = \
            sorted(f.stem for f in folder.glob("*.yaml"))
    if "hydra/launcher" in groups:  # Hydra's own default launcher, which has no file here
        groups["hydra/launcher"].insert(0, "basic")
        defaults["hydra/launcher"] = "basic"
    notes = {"+experiment": "a preset: mice-exp -m +experiment=NAME",
             "+scale": "a preset on the first 3 STE APIs: +experiment=NAME +scale=small",
             "hydra/launcher": "how a sweep's jobs run: mice-exp -m hydra/launcher=NAME"}
    pad = max(map(len, groups)) + 2
    lines = ["Config groups (GROUP=OPTION, each a file conf/GROUP/OPTION.yaml; * the default):"]
    for group, options in groups.items():
        shown = " | ".join(f"{o}*" if defaults.get(group.lstrip("+")) == o else o for o in options)
        if group in notes:
            shown += f"  ({notes[group]})"
        lines += textwrap.wrap(shown, width, initial_indent=f"  {group + '=':<{pad}}",
                               subsequent_indent=" " * (pad + 2), break_on_hyphens=False)
    return "\n".join(lines)


def check_command(argv: Sequence[str]) -> None:
    """A first word that is neither a subcommand, an override nor a flag is a mistyped subcommand; a launcher
    chosen for a single run (which Hydra ignores) or one that cannot launch here is said before Hydra starts,
    so no MLflow sweep run opens for it."""
    if argv and "=" not in argv[0] and not argv[0].startswith(("-", "+", "~")):
        raise UserError(f"unknown command {argv[0]!r}; expected one of {', '.join(COMMANDS)} "
                        "or key=value overrides (mice-exp --help)")
    launchers = [arg.split("=", 1)[1] for arg in argv if arg.lstrip("+").startswith("hydra/launcher=")]
    if not launchers:
        return
    if not {"-m", "--multirun", "hydra.mode=MULTIRUN"} & set(argv):
        raise UserError(f"hydra/launcher={launchers[-1]} launches the jobs of a sweep, and without -m this is one "
                        f"run, here, in this process; expected mice-exp -m hydra/launcher={launchers[-1]} ... "
                        "(or no hydra/launcher for one run)")
    if launchers[-1] in ("slurm", "slurm_gpu"):
        problem = missing_client()
        if problem is not None:
            raise UserError(problem)


def inspect(argv: Sequence[str]) -> None:
    """``mice-exp inspect EXAMPLE [overrides]``: per-layer logit-lens strings of one example (MICE Figure 2)."""
    if wants_help(argv):
        print(INSPECT_USAGE)
        return
    targets = [a for a in argv if "=" not in a]
    if len(targets) != 1:
        raise UserError(f"{INSPECT_USAGE.splitlines()[0]}; expected exactly one example")
    from mice_exp.pipeline import Pipeline  # loads numpy

    # a bad value (llm.batch_size=0 and the like) is one line, as in a run, before torch is imported
    stage = Pipeline.from_config(compose_config([a for a in argv if "=" in a])).stage
    from mice_exp.llm.inspect import layer_table  # loads numpy

    print(layer_table(stage, targets[0]))


def report(argv: Sequence[str]) -> None:
    """``mice-exp report ...``: paper tables and figures from the FINISHED MLflow runs."""
    if wants_help(argv):
        parse_args(["--help"])  # prints the usage and exits 0
    from mice_exp.report.command import report as run_report  # loads matplotlib, sklearn

    run_report(argv)


def gate(argv: Sequence[str]) -> None:
    """``mice-exp gate model=... input=queries.jsonl``: calibrated execute / abstain decisions for new queries."""
    from mice_exp.gate.command import gate as run_gate  # loads numpy

    run_gate(argv)


def serve(argv: Sequence[str]) -> None:
    """``mice-exp serve model=...``: the gate as an OpenAI-compatible chat-completions endpoint on 127.0.0.1."""
    from mice_exp.gate.command import serve as run_serve  # loads numpy

    run_serve(argv)


def records(argv: Sequence[str]) -> None:
    """``mice-exp records [output=FILE] [overrides]``: publish the configured LLM stage as a records file."""
    if wants_help(argv):
        print(RECORDS_USAGE)
        return
    from mice_exp.llm.publish import default_path, publish_records  # loads numpy
    from mice_exp.pipeline import Pipeline  # loads numpy

    outputs = [a.split("=", 1)[1] for a in argv if a.startswith("output=")]
    actors = [a.split("=", 1)[1] for a in argv if a.startswith("actor=")]
    pipeline = Pipeline.from_config(compose_config([a for a in argv if not a.startswith(("output=", "actor="))]))
    stage = pipeline.stage
    if actors and stage.records_path is not None:
        raise UserError(f"actor={actors[-1]} with llm.records={stage.llm.records}: judging teacher-forces the "
                        f"actor's calls through llm={stage.llm.name} itself, so llm.records would be ignored; "
                        "expected no llm.records (an LLM's records to judge go in actor=FILE)")
    if actors:  # the actors' calls judged by the configured LLM, each rendered canonically
        from mice_exp.llm.judge import publish_judged, resolve_actors  # loads numpy

        folder = resolve(outputs[0], Path.cwd()) if outputs else stage.paths.root / "experiments" / "records" / "actors"
        actor_set = resolve_actors(stage, actors[-1], resolve(pipeline.config["actors"]["folder"], stage.paths.root),
                                   Path.cwd())
        for path in publish_judged(stage, actor_set, folder, pipeline.sources):
            print(f"records: {path} ({path.stat().st_size / 1e6:.2f} MB); Table 1 on it with "
                  f"llm={stage.llm.name} llm.records={path}")
        return
    # replacing the file it reads (llm.records=F output=F: adding sources) is what the command is for
    same = bool(outputs) and stage.records_path == resolve(outputs[0], Path.cwd())
    path = writable_file(outputs[0] if outputs else default_path(stage), Path.cwd(), "output",
                         force=pipeline.force or same)
    if stage.llm.shard is not None and stage.records_path is None:  # one worker of a sharded stage
        note = stage.shard_note(stage.run())
        if note is not None:  # the worker that completes the stage publishes
            print(note)
            return
    path = publish_records(stage, pipeline.sources, path)
    print(f"records: {path} ({path.stat().st_size / 1e6:.2f} MB); rebuild any table with llm.records={path}")


def mcq(argv: Sequence[str]) -> None:
    """``mice-exp mcq [template=...] [output=FILE] [overrides]``: each candidate answer's log-likelihood."""
    if wants_help(argv):
        print(MCQ_USAGE)
        return
    from mice_exp.pipeline import Pipeline  # loads numpy

    own = ("output=", "template=")
    outputs = [a.split("=", 1)[1] for a in argv if a.startswith("output=")]
    template = ([a.split("=", 1)[1] for a in argv if a.startswith("template=")] or ["plain"])[-1]
    pipeline = Pipeline.from_config(compose_config([a for a in argv if not a.startswith(own)]))
    from mice_exp.llm.choices import default_path, write_mcq  # loads torch, transformers

    path = writable_file(outputs[-1] if outputs else default_path(pipeline.stage, template), Path.cwd(), "output",
                         force=pipeline.force)
    count = write_mcq(pipeline.stage, template, path)
    print(f"mcq: {path}: {count} items scored; tables with python experiments/when2call/tables.py")


def ui(argv: Sequence[str]) -> None:
    """``mice-exp ui [overrides]``: print the link to the runs table in the Table-1 view, then serve the
    local store on 127.0.0.1:5000 (a tracking server already has its UI: only the link is printed)."""
    if wants_help(argv):
        print(UI_USAGE)
        return

    from mice_exp.tracking import ensure_experiment, tracking_uri  # loads numpy
    from mice_exp.tracking.dashboard import LOCAL_UI, experiment_link  # loads numpy

    cfg = as_plain(compose_config(list(argv)))
    root, uri = project_root(), tracking_uri(cfg["tracking"], project_root())
    experiment = ensure_experiment(cfg["tracking"], root)
    if experiment is None:
        raise UserError("tracking.enabled=false: there is no MLflow store to show; expected tracking.enabled=true")
    print(f"MLflow runs of experiment {cfg['tracking']['experiment']!r}: {experiment_link(uri, experiment)}", flush=True)
    if uri.startswith(("http://", "https://")):
        return
    host, port = LOCAL_UI.removeprefix("http://").split(":")
    subprocess.run([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", port],
                   check=False)


def claude_hook(argv: Sequence[str]) -> None:
    """``mice-exp claude-hook gate=URL [...]``: the gate as a Claude Code ``PreToolUse`` command hook."""
    if wants_help(argv):
        print(CLAUDE_HOOK_USAGE)
        return
    known = {"gate", "tools", "tau", "timeout", "fail_open", "trusted"}
    opts = dict(a.split("=", 1) for a in argv if "=" in a)
    wrong = [a for a in argv if "=" not in a or a.split("=", 1)[0] not in known]
    if wrong or "gate" not in opts:
        raise UserError(f"{CLAUDE_HOOK_USAGE.splitlines()[0]}; expected gate=URL"
                        + (f", not {wrong[0]!r}" if wrong else ""))
    if opts.get("fail_open", "false") not in ("true", "false"):
        raise UserError(f"fail_open={opts['fail_open']}; expected true or false")
    tools = json.loads(resolve(opts["tools"], Path.cwd()).read_text()) if "tools" in opts else []
    hook = GateHook(opts["gate"], tools=tools, tau=float(opts["tau"]) if "tau" in opts else None,
                    timeout=float(opts.get("timeout", HOOK_TIMEOUT)), fail_open=opts.get("fail_open") == "true",
                    trusted=opts.get("trusted", "allow"))  # type: ignore[arg-type]
    command(hook)


COMMANDS: dict[str, Callable[[Sequence[str]], None]] = {"inspect": inspect, "report": report, "gate": gate,
                                                        "serve": serve, "records": records, "mcq": mcq,
                                                        "ui": ui, "claude-hook": claude_hook}
