"""Sub-commands of ``mice-exp`` besides the Hydra app (they compose the same configs)."""

from __future__ import annotations

from typing import Callable, Sequence

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from mice_exp.errors import UserError
from mice_exp.paths import project_root


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """The config the Hydra app would see for these overrides."""
    with initialize_config_dir(config_dir=str(project_root() / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def inspect(argv: Sequence[str]) -> None:
    """``mice-exp inspect EXAMPLE [overrides]``: per-layer logit-lens strings of one example (MICE Figure 2)."""
    from mice_exp.llm.inspect import layer_table
    from mice_exp.run import as_plain

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


def ui(argv: Sequence[str]) -> None:
    """``mice-exp ui [overrides]``: print the link to the runs table in the Table-1 view, then serve the
    local store on 127.0.0.1:5000 (a tracking server already has its UI: only the link is printed)."""
    import subprocess
    import sys

    from mice_exp.run import as_plain
    from mice_exp.tracking import ensure_experiment, tracking_uri
    from mice_exp.tracking.dashboard import LOCAL_UI, experiment_link

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


COMMANDS: dict[str, Callable[[Sequence[str]], None]] = {"inspect": inspect, "report": report, "gate": gate, "ui": ui}
