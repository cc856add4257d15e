"""The configs the Hydra app sees, for callers outside it (sub-commands, the gate, tests).

Its own module because both the pipeline (:mod:`mice_exp.run`) and the sub-commands it does not
know about (:mod:`mice_exp.gate.command`) need it: living in either made them import each other.
"""

from __future__ import annotations

from typing import Any, Sequence

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mice_exp.errors import UserError
from mice_exp.paths import project_root

HELP_FLAGS = ("-h", "--help")


def wants_help(argv: Sequence[str]) -> bool:
    """A sub-command asked for its usage (answered before anything loads)."""
    return any(arg in HELP_FLAGS for arg in argv)


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """The config the Hydra app would see for these overrides (a bad override is a one-line UserError)."""
    try:
        with initialize_config_dir(config_dir=str(project_root() / "conf"), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise UserError(" ".join(str(error).split())) from None


def as_plain(cfg: DictConfig | dict) -> dict[str, Any]:
    """Resolve interpolations (failing on missing values) into plain containers."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    return cfg
