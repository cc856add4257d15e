"""Sub-commands of ``mice-exp`` besides the Hydra app (they compose the same configs)."""

from __future__ import annotations

from typing import Callable, Sequence

from mice_exp.compose import as_plain, compose_config
from mice_exp.errors import UserError


def inspect(argv: Sequence[str]) -> None:
    """``mice-exp inspect EXAMPLE [overrides]``: per-layer logit-lens strings of one example (MICE Figure 2)."""
    from mice_exp.llm.inspect import layer_table

    targets = [a for a in argv if "=" not in a]
    if len(targets) != 1:
        raise UserError("usage: mice-exp inspect EXAMPLE_ID_OR_INDEX [hydra overrides]; expected exactly one example")
    print(layer_table(as_plain(compose_config([a for a in argv if "=" in a])), targets[0]))


def report(argv: Sequence[str]) -> None:
    """``mice-exp report ...``: paper tables and figures from the FINISHED MLflow runs."""
    from mice_exp.report.command import report as run_report

    run_report(argv)


def gate(argv: Sequence[str]) -> None:
    """``mice-exp gate model=... input=queries.jsonl``: calibrated execute / abstain decisions for new queries."""
    from mice_exp.gate.command import gate as run_gate

    run_gate(argv)


COMMANDS: dict[str, Callable[[Sequence[str]], None]] = {"inspect": inspect, "report": report, "gate": gate}
