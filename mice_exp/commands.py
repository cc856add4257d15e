"""Sub-commands of ``mice-exp`` besides the Hydra app (they compose the same configs)."""

from __future__ import annotations

from pathlib import Path
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


def records(argv: Sequence[str]) -> None:
    """``mice-exp records [output=FILE] [overrides]``: publish the configured LLM stage as a records file."""
    from mice_exp.llm.publish import publish_records

    outputs = [a.split("=", 1)[1] for a in argv if a.startswith("output=")]
    cfg = as_plain(compose_config([a for a in argv if not a.startswith("output=")]))
    path = publish_records(cfg, Path(outputs[0]).resolve() if outputs else None)
    print(f"records: {path} ({path.stat().st_size / 1e6:.2f} MB); rebuild any table with llm.records={path}")


COMMANDS: dict[str, Callable[[Sequence[str]], None]] = {"inspect": inspect, "report": report, "gate": gate,
                                                        "records": records}
