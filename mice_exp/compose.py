"""The configs the Hydra app sees, for callers outside it (sub-commands, the gate, tests).

Its own module because both the pipeline (:mod:`mice_exp.run`) and the sub-commands it does not
know about (:mod:`mice_exp.gate.command`) need it: living in either made them import each other.
:func:`build_object` turns a group's node (``protocol``, ``features``) into its object in one hop.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any, Mapping, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from mice_exp.errors import UserError
from mice_exp.paths import project_root

HELP_FLAGS = ("-h", "--help")


def wants_help(argv: Sequence[str]) -> bool:
    """A sub-command asked for its usage (answered before anything loads)."""
    return any(arg in HELP_FLAGS for arg in argv)


#: What a mandatory setting (``???`` in its YAML) expects, for the one line naming it.
MANDATORY = {
    "dataset.path": 'FILE.jsonl (one tool call per line: {"id", "api", "query", "tools", '
                    '"gold": {"action", "action_input"}}; see conf/dataset/jsonl.yaml)',
}


def missing_value(cfg: Mapping[str, Any], key: str) -> str:
    """The one line for a mandatory setting left unset, naming the group option that needs it
    (``dataset=jsonl needs dataset.path=...``): checked as the config resolves, before anything loads."""
    group, _, _ = key.partition(".")
    option = cfg.get(group, {}).get("name") if "." in key else None
    who = f"{group}={option}" if isinstance(option, str) else "this config"
    return f"{who} needs {key}={MANDATORY.get(key, 'VALUE')}"


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """The config the Hydra app would see for these overrides (a bad override is a one-line UserError)."""
    try:
        with initialize_config_dir(config_dir=str(project_root() / "conf"), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise UserError(" ".join(str(error).split())) from None


def as_plain(cfg: DictConfig | dict) -> dict[str, Any]:
    """Resolve interpolations into plain containers; a mandatory value left unset (``???``) or an interpolation
    that does not resolve is a one-line UserError, the first thing every command does with its config."""
    if not isinstance(cfg, DictConfig):
        return cfg
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as error:
        raise UserError(missing_value(cfg, str(error.full_key))) from None
    except OmegaConfBaseException as error:  # ${nope}, ${oc.env:UNSET}
        reason = str(error).splitlines()[0]  # the lines below repeat the key and name the node's type
        raise UserError(f"{error.full_key}: {reason}; expected a value or an interpolation that resolves") from None


def group_options(group: str) -> list[str]:
    """The options of a config group in ``conf/`` (what ``group=NAME`` accepts)."""
    return sorted(p.stem for p in (project_root() / "conf" / group).glob("*.yaml"))


@cache
def estimator_names() -> dict[str, str]:
    """What each ``conf/estimator`` entry calls its rows (``name``), by the ``key`` its runs log it under, as its
    file resolves alone (a field correction's by its default base): the names a report gives reference rows, so
    that a new estimator is named by its own YAML."""
    entries = [OmegaConf.load(project_root() / "conf" / "estimator" / f"{name}.yaml")
               for name in group_options("estimator")]
    return {str(entry.key): str(entry.name) for entry in entries}


def store_baselines() -> None:
    """``baselines: all`` of ``conf/config.yaml``: every ``conf/estimator`` entry again under ``baselines.<name>``,
    composed by Hydra so that a command-line override reaches it (``baselines.hre.model.n_bins=20``), with no list
    to extend for a new estimator file. Stored in Hydra's ConfigStore as Hydra starts, before it composes anything
    (``hydra_plugins/mice_exp_conf``); an estimator file outside ``conf/`` (``hydra.searchpath``) is added with
    ``+estimator@baselines.NAME=NAME``."""
    entries = [{f"/estimator@{name}": name} for name in group_options("estimator")]
    ConfigStore.instance().store(group="baselines", name="all", node={"defaults": entries}, provider="mice_exp")


def build_object(node: Mapping[str, Any], group: str, kind: type, labels: Mapping[str, str | None]) -> Any:
    """The object a config group's node names with ``_target_``, built in one hop by Hydra.

    ``labels`` are keys of the node that name it rather than configure it (they are not passed to the
    object): ``{key: attribute}`` checks that the node's value is the object's own ``attribute``
    (``protocol.name=kfold`` on the holdout protocol would mislabel every table and run), ``{key: None}``
    only drops the key. Every problem is one line naming the group.
    """
    params = {k: v for k, v in node.items() if k not in labels}
    target = params.get("_target_")
    choose = f"choose a {group} with {group}={'|'.join(group_options(group))}"
    if not target:
        raise UserError(f"{group} has no _target_; expected a conf/{group} entry naming its class ({choose})")
    check_settings(params, group, labels)
    try:
        built = instantiate(params, _convert_="all")
    except InstantiationException as error:
        if isinstance(error.__cause__, UserError):  # the object's own one line about its settings
            raise error.__cause__ from None
        reason = " ".join(str(error).replace(", set env var HYDRA_FULL_ERROR=1 to see chained exception", "").split())
        raise UserError(f"{group}._target_={target!r}: {reason}; expected a class of mice_exp ({choose})") from None
    if not isinstance(built, kind):
        raise UserError(f"{group}._target_={target!r} is a {type(built).__name__}; expected a {kind.__name__} ({choose})")
    for key, attribute in labels.items():
        own = getattr(built, attribute) if attribute else None
        if own is not None and key in node and node[key] != own:
            raise UserError(f"{group}.{key}={node[key]!r}, but {group}._target_={target} is the {own!r} {group}; "
                            f"expected {group}.{key}={own} ({choose})")
    return built


def check_settings(params: Mapping[str, Any], group: str, labels: Mapping[str, str | None]) -> None:
    """A key of the node that its ``_target_`` class does not take by name up its bases (``+dataset.max_api=3``,
    a typo of ``max_apis``; a ``**kwargs`` is taken to be handed up) is refused as a top-level one is, naming
    what the class takes; a target that does not import is refused by :func:`build_object` itself."""
    try:
        cls = get_class(params["_target_"])
    except Exception:  # noqa: BLE001 - build_object's instantiate says why in one line
        return
    takes: set[str] = set()
    for base in cls.__mro__:
        init = base.__dict__.get("__init__")
        if init is None or base is object:
            continue
        takes |= {name for name, parameter in inspect.signature(init).parameters.items()
                  if name != "self" and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)}
    for key in sorted(set(params) - {"_target_"} - takes):
        raise UserError(f"{group}.{key}={params[key]!r} is not a setting of {params['_target_']}: nothing reads it; "
                        f"expected one of {group}.{'|'.join(sorted(takes | set(labels)))}")
