"""Entrypoint: ``mice-exp [overrides]`` runs the Hydra app; ``mice-exp inspect ...`` looks inside one example."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from mice_exp.errors import UserError
from mice_exp.paths import project_root

CONFIG_DIR = str(project_root() / "conf")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def hydra_app(cfg: DictConfig) -> float | None:
    from mice_exp.run import run

    try:
        return run(cfg).get("objective")
    except UserError as error:  # Hydra would print a traceback; a user error gets one line
        _fail(error)


def _fail(error: UserError) -> None:
    print(f"mice-exp: error: {error}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    from mice_exp.commands import COMMANDS, USAGE, check_command
    from mice_exp.compose import HELP_FLAGS

    argv = sys.argv[1:]
    try:
        if argv and argv[0] in HELP_FLAGS:
            print(USAGE)
        elif argv and argv[0] in COMMANDS:
            COMMANDS[argv[0]](argv[1:])
        else:
            check_command(argv)
            hydra_app()
    except UserError as error:
        _fail(error)


if __name__ == "__main__":
    main()
