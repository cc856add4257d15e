"""Sub-commands of ``mice-exp`` besides the Hydra app (they compose the same configs)."""

from __future__ import annotations

from typing import Callable, Sequence

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from mice_exp.errors import UserError
from mice_exp.paths import project_root

HELP_FLAGS = ("-h", "--help")
USAGE = """usage: mice-exp [-m] [key=value ...]         run the configured experiment (a sweep with -m)
       mice-exp inspect EXAMPLE [key=value ...] per-layer logit-lens strings of one example
       mice-exp gate model=... input=...        calibrated execute / abstain decisions for new queries
       mice-exp report [--sweep DIR] [...]      paper tables and figures from the finished MLflow runs

Each subcommand takes -h / --help. Config groups and their options (llm=, dataset=, features=,
estimator=, risk=, protocol=, ...): `mice-exp --hydra-help`; the resolved config: `mice-exp --cfg job`."""
INSPECT_USAGE = "usage: mice-exp inspect EXAMPLE_ID_OR_INDEX [hydra overrides]"


def wants_help(argv: Sequence[str]) -> bool:
    return any(arg in HELP_FLAGS for arg in argv)


def check_command(argv: Sequence[str]) -> None:
    """A first word that is neither a subcommand, an override nor a flag is a mistyped subcommand."""
    if argv and "=" not in argv[0] and not argv[0].startswith(("-", "+", "~")):
        raise UserError(f"unknown command {argv[0]!r}; expected one of {', '.join(COMMANDS)} "
                        "or key=value overrides (mice-exp --help)")


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """The config the Hydra app would see for these overrides (a bad override is a one-line UserError)."""
    try:
        with initialize_config_dir(config_dir=str(project_root() / "conf"), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise UserError(" ".join(str(error).split())) from None


def inspect(argv: Sequence[str]) -> None:
    """``mice-exp inspect EXAMPLE [overrides]``: per-layer logit-lens strings of one example (MICE Figure 2)."""
    if wants_help(argv):
        print(INSPECT_USAGE)
        return
    from mice_exp.llm.inspect import layer_table
    from mice_exp.run import as_plain

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


COMMANDS: dict[str, Callable[[Sequence[str]], None]] = {"inspect": inspect, "report": report, "gate": gate}
