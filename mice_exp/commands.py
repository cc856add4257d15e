"""Sub-commands of ``mice-exp`` besides the Hydra app (they compose the same configs)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from mice_exp.compose import as_plain, compose_config, wants_help
from mice_exp.errors import UserError

USAGE = """usage: mice-exp [-m] [key=value ...]         run the configured experiment (a sweep with -m)
       mice-exp inspect EXAMPLE [key=value ...] per-layer logit-lens strings of one example
       mice-exp gate model=... input=...        calibrated execute / abstain decisions for new queries
       mice-exp report [--sweep DIR] [...]      paper tables and figures from the finished MLflow runs
       mice-exp records [output=FILE] [...]     publish the LLM stage as a records file (llm.records=FILE)

Each subcommand takes -h / --help. Config groups and their options (llm=, dataset=, features=,
estimator=, risk=, protocol=, ...): `mice-exp --hydra-help`; the resolved config: `mice-exp --cfg job`."""
INSPECT_USAGE = "usage: mice-exp inspect EXAMPLE_ID_OR_INDEX [hydra overrides]"
RECORDS_USAGE = ("usage: mice-exp records [output=FILE] [hydra overrides]\n"
                 "writes the configured LLM stage (computed or resumed if needed) and its sources.use as a\n"
                 "records file, by default experiments/records/<dataset>-<llm>.jsonl.gz; any run takes it\n"
                 "back with llm.records=FILE and needs no LLM")


def check_command(argv: Sequence[str]) -> None:
    """A first word that is neither a subcommand, an override nor a flag is a mistyped subcommand."""
    if argv and "=" not in argv[0] and not argv[0].startswith(("-", "+", "~")):
        raise UserError(f"unknown command {argv[0]!r}; expected one of {', '.join(COMMANDS)} "
                        "or key=value overrides (mice-exp --help)")


def inspect(argv: Sequence[str]) -> None:
    """``mice-exp inspect EXAMPLE [overrides]``: per-layer logit-lens strings of one example (MICE Figure 2)."""
    if wants_help(argv):
        print(INSPECT_USAGE)
        return
    from mice_exp.llm.inspect import layer_table

    targets = [a for a in argv if "=" not in a]
    if len(targets) != 1:
        raise UserError(f"{INSPECT_USAGE}; expected exactly one example")
    print(layer_table(as_plain(compose_config([a for a in argv if "=" in a])), targets[0]))


def report(argv: Sequence[str]) -> None:
    """``mice-exp report ...``: paper tables and figures from the FINISHED MLflow runs."""
    if wants_help(argv):
        from mice_exp.report.arguments import parse_args

        parse_args(["--help"])  # prints the usage and exits 0
    from mice_exp.report.command import report as run_report

    run_report(argv)


def gate(argv: Sequence[str]) -> None:
    """``mice-exp gate model=... input=queries.jsonl``: calibrated execute / abstain decisions for new queries."""
    from mice_exp.gate.command import gate as run_gate

    run_gate(argv)


def records(argv: Sequence[str]) -> None:
    """``mice-exp records [output=FILE] [overrides]``: publish the configured LLM stage as a records file."""
    if wants_help(argv):
        print(RECORDS_USAGE)
        return
    from mice_exp.llm.publish import publish_records

    outputs = [a.split("=", 1)[1] for a in argv if a.startswith("output=")]
    cfg = as_plain(compose_config([a for a in argv if not a.startswith("output=")]))
    path = publish_records(cfg, Path(outputs[0]).resolve() if outputs else None)
    print(f"records: {path} ({path.stat().st_size / 1e6:.2f} MB); rebuild any table with llm.records={path}")


COMMANDS: dict[str, Callable[[Sequence[str]], None]] = {"inspect": inspect, "report": report, "gate": gate,
                                                        "records": records}
