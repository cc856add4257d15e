"""Config validation: every value a user can set is checked before any data or model loads.

Each failure is a one-line :class:`UserError` naming the key, the value given and what is expected,
so a typo costs seconds, not a model load (or an hour of generation) followed by a traceback.
"""

from __future__ import annotations

import math
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import yaml

from mice_exp.errors import UserError, expect
from mice_exp.llm.precision import DTYPES
from mice_exp.needs import Needs
from mice_exp.paths import project_root

if TYPE_CHECKING:  # annotations only
    from mice_exp.llm.settings import LLMSettings

STAGES = ("llm", "all")
#: The top-level keys of conf/config.yaml and its groups: a key beyond them (``+tau=0.8``) is read by nothing.
SETTINGS = ("dataset", "llm", "prompt", "features", "estimator", "risk", "protocol", "tracking", "sources", "gate",
            "baselines", "scale", "compare_with", "permutations", "n_jobs", "retrieval", "stage", "paths", "seed",
            "force", "actor", "actors")
RISK_KEYS = ("name", "tp", "fp", "tn", "fn")
#: The groups read as plain mappings (nothing builds them with ``_target_``, which would refuse an unknown key
#: itself): a key none of their YAML files defines is read by nothing. The nested nodes of ``sources`` too, the
#: blocks of the sources table (:func:`source_blocks`).
PLAIN_GROUPS = ("dataset", "llm", "prompt", "tracking", "sources", "gate", "retrieval", "paths", "estimator", "actors")
DEVICE = re.compile(r"(cpu|auto|mps|cuda(:\d+)?)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


Rule = tuple[Callable[[Any], bool], str]
INTEGER: Rule = (_is_int, "an integer")
POSITIVE_INT: Rule = (lambda v: _is_int(v) and v > 0, "a positive integer")
NON_NEGATIVE_INT: Rule = (lambda v: _is_int(v) and v >= 0, "a non-negative integer")
WORKERS: Rule = (lambda v: _is_int(v) and v != 0, "a non-zero integer (-1: every core)")
FINITE: Rule = (_is_number, "a finite number")
POSITIVE: Rule = (lambda v: _is_number(v) and v > 0, "a finite number > 0")
PROBABILITY: Rule = (lambda v: _is_number(v) and 0 < v < 1, "a probability strictly between 0 and 1")
DEVICES: Rule = (lambda v: isinstance(v, str) and DEVICE.fullmatch(v) is not None, "cpu, cuda, cuda:N, mps or auto")
DTYPE: Rule = (lambda v: v in DTYPES, f"one of {', '.join(DTYPES)}")
OPTIONAL_POSITIVE_INT: Rule = (lambda v: v is None or POSITIVE_INT[0](v), "a positive integer or null")
OPTIONAL_INT: Rule = (lambda v: v is None or _is_int(v), "an integer or null")
SIZES: Rule = (lambda v: isinstance(v, list) and bool(v) and all(POSITIVE_INT[0](s) for s in v),
               "a non-empty list of positive integers")

OPTIONAL_NON_NEGATIVE_INT: Rule = (lambda v: v is None or NON_NEGATIVE_INT[0](v), "a non-negative integer or null")
SPLIT_NAMES = ("train", "validation", "test")  # data.splits.SPLIT_NAMES; importing it would load every data loader
DEMO_POOLS = ("train", "all")  # data.DEMO_POOLS, for the same reason
DEMO_POOL: Rule = (lambda v: v in DEMO_POOLS, f"one of {', '.join(DEMO_POOLS)}")
CALL_FORMATS = ("react", "json", "tool_call")  # llm.toolcall.FORMATS, for the same reason
CALL_FORMAT: Rule = (lambda v: v in CALL_FORMATS, f"one of {', '.join(CALL_FORMATS)}")
TOOL_MODES = ("text", "schemas")  # llm.settings.TOOL_MODES
DEMO_TOOLS = ("pooled", "per_demo")  # llm.settings.DEMO_TOOLS
DEMO_MIXES = ("similar", "balanced", "calling")  # data.retrieval.DEMO_MIXES
TOOL_MODE: Rule = (lambda v: v in TOOL_MODES, f"one of {', '.join(TOOL_MODES)}")
DEMO_TOOLS_RULE: Rule = (lambda v: v in DEMO_TOOLS, f"one of {', '.join(DEMO_TOOLS)}")
DEMO_MIX: Rule = (lambda v: v in DEMO_MIXES, f"one of {', '.join(DEMO_MIXES)}")
SPLITS: Rule = (lambda v: v is None or (isinstance(v, list) and bool(v) and set(v) <= set(SPLIT_NAMES)),
                f"null or a non-empty list of {', '.join(SPLIT_NAMES)}")
OPTIONAL_TEXT: Rule = (lambda v: v is None or (isinstance(v, str) and bool(v.strip())), "null or a non-empty string")

#: Dotted key -> rule; a key absent from the composed config (another group's option) is skipped.
RULES: dict[str, Rule] = {
    "seed": INTEGER,
    "permutations": NON_NEGATIVE_INT,
    "n_jobs": WORKERS,
    "llm.batch_size": POSITIVE_INT,
    "llm.max_new_tokens": POSITIVE_INT,
    "llm.context_window": POSITIVE_INT,
    "llm.dtype": DTYPE,
    "llm.device": DEVICES,
    "llm.shards": POSITIVE_INT,
    "llm.shard": OPTIONAL_INT,
    "retrieval.device": DEVICES,
    "prompt.k_demos": NON_NEGATIVE_INT,
    "prompt.demo_pool": DEMO_POOL,
    "prompt.format": CALL_FORMAT,
    "prompt.tools": TOOL_MODE,
    "prompt.demo_tools": DEMO_TOOLS_RULE,
    "prompt.demo_mix": DEMO_MIX,
    "prompt.no_call_note": OPTIONAL_TEXT,
    "dataset.seed": INTEGER,
    "dataset.max_apis": OPTIONAL_POSITIVE_INT,
    "dataset.max_per_api": OPTIONAL_POSITIVE_INT,
    "features.components": POSITIVE_INT,
    "features.encoder.batch_size": POSITIVE_INT,
    "features.encoder.num_layers": POSITIVE_INT,
    "features.encoder.device": DEVICES,
    "risk.tp": FINITE,
    "risk.fp": FINITE,
    "risk.tn": FINITE,
    "risk.fn": FINITE,
    "protocol.sizes": SIZES,
    "protocol.trials": POSITIVE_INT,
    "protocol.n_jobs": WORKERS,
    "estimator.model.val_fraction": PROBABILITY,
    "estimator.diagnostics.eps": PROBABILITY,
    "estimator.diagnostics.min_region": POSITIVE_INT,
    "sources.verbalized.max_new_tokens": POSITIVE_INT,
    "sources.consistency.samples": POSITIVE_INT,
    "sources.consistency.temperature": POSITIVE,
    "sources.consistency.seed": INTEGER,
    "sources.consistency.splits": SPLITS,
    "sources.consistency.extra_tokens": OPTIONAL_NON_NEGATIVE_INT,
    "sources.acts.max_new_tokens": POSITIVE_INT,
}


#: What a mandatory (``???``) setting expects, by dotted key: the group option that leaves it unset names it.
def _lookup(cfg: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


@cache
def group_keys(group: str) -> frozenset[str]:
    """The keys of ``group`` (dotted for a nested node) that some YAML file under ``conf/`` defines: its options,
    ``conf/config.yaml`` and the presets (``# @package _global_``)."""
    conf = project_root() / "conf"
    head, *rest = group.split(".")
    options = [(p, rest) for p in sorted((conf / head).glob("*.yaml"))]
    options += [(p, [head, *rest]) for p in [conf / "config.yaml", *sorted((conf / "experiment").glob("*.yaml"))]]
    keys: set[str] = set()
    for path, below in options:
        node = yaml.safe_load(path.read_text()) or {}
        for part in below:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            keys |= set(node) - {"defaults"}
    return frozenset(keys)


def source_blocks() -> list[str]:
    """The ``sources.<block>`` nodes the confidence sources read, from the sources table
    (:data:`mice_exp.llm.sources.SOURCES`): a new source's block is checked as the others are."""
    from mice_exp.llm.sources import SOURCES  # loads numpy, hydra: the value rules import no computation

    return [f"sources.{block}" for block in dict.fromkeys(source.block for source in SOURCES.values())]


def check_group_keys(cfg: Mapping[str, Any]) -> None:
    """A key added inside a plain group (``+prompt.demo_pol=all``, a typo of ``prompt.demo_pool``) or a source's
    block (``+sources.consistency.sampels=5``) is refused as a top-level one is: nothing would read it, and the run
    would go on with the default."""
    for group in (*PLAIN_GROUPS, *source_blocks()):
        present, node = _lookup(cfg, group)
        if not present or not isinstance(node, Mapping):
            continue
        if "_target_" in node:  # its class says what it takes, where it is built (compose.build_object)
            continue
        allowed = group_keys(group)
        for key in sorted(set(node) - allowed):
            raise UserError(f"{group}.{key}={node[key]!r} is not a setting: nothing reads it; expected one of "
                            f"{group}.{'|'.join(sorted(allowed))}")


def check_values(cfg: Mapping[str, Any]) -> None:
    """Every value of :data:`RULES` present in ``cfg``."""
    for key, (ok, expected) in RULES.items():
        present, value = _lookup(cfg, key)
        expect(not present or ok(value), f"{key}={value!r}; expected {expected}")


def check_risk(risk: Mapping[str, Any]) -> None:
    """``conf/risk`` holds the four utilities and its name, nothing else."""
    for key in sorted(set(risk) - set(RISK_KEYS)):
        raise UserError(f"risk.{key}={risk[key]!r}: not a risk setting (tau follows from the utilities); "
                        f"expected only risk.{', risk.'.join(RISK_KEYS)}")


def check_llm(llm: LLMSettings) -> None:
    """The relations between ``conf/llm`` values: room for a prompt, a worker among the workers."""
    expect(llm.prompt_budget > 0,
           f"llm.context_window={llm.context_window} leaves no room for a prompt after "
           f"llm.max_new_tokens={llm.max_new_tokens}; expected context_window > max_new_tokens")
    shard, shards = llm.shard, llm.shards
    expect(shard is None or 0 <= shard < shards,
           f"llm.shard={shard} is not one of the llm.shards={shards} workers; expected 0 <= llm.shard < {shards} "
           "(or null: every worker)")
    expect(not llm.records or (shard is None and shards == 1),
           f"llm.records={llm.records} is a finished LLM stage that nothing generates, so llm.shards={shards} "
           f"llm.shard={shard} has no batches to share; expected llm.records without llm.shards / llm.shard, or "
           "llm.shards / llm.shard without llm.records (to generate the stage)")


def check_model_folder(source: Mapping[str, Any]) -> None:
    """A local ``llm.source.path`` must hold a model, not be an empty or unrelated folder."""
    path = Path(str(source.get("path") or "")).expanduser()
    if source.get("kind") == "pretrained" and path.is_dir():
        expect((path / "config.json").is_file(),
               f"llm.source.path={str(path)!r} has no config.json; expected a model folder "
               "(config.json, tokenizer files and weights)")


def check_run_shape(dataset: Mapping[str, Any], protocol: Mapping[str, Any], stage: str) -> None:
    """Settings that make the estimation impossible whatever the data."""
    split = dataset.get("split") or {}
    if stage == "all":
        expect(split.get("train", 1) != 0, "dataset.split.train=0: the estimators need training calls; "
                                            "expected dataset.split.train > 0 (or stage=llm)")
    if protocol["name"] == "loao":
        apis = dataset.get("apis")
        single = dataset.get("max_apis") == 1 or (isinstance(apis, list) and len(apis) == 1)
        expect(not single, "protocol=loao leaves one API out at a time, so it needs at least 2 APIs; "
                           "expected dataset.max_apis >= 2 (or null) or protocol=holdout")


def used_baselines(estimator: Mapping[str, Any], baselines: Mapping[str, Any] | None,
                   named: Sequence[str]) -> list[str]:
    """The ``baselines`` entries a run reads: those it ``named`` (its reference rows, the sample-efficiency
    protocol's estimators), then its ``estimator``'s base (and that base's base), each once."""
    baselines = baselines or {}
    names = list(named)
    entry = estimator
    while entry.get("base") and entry["base"] not in names:
        names.append(entry["base"])
        entry = baselines.get(entry["base"]) or {}
    return list(dict.fromkeys(names))


def check_baseline_values(cfg: Mapping[str, Any]) -> None:
    """The estimator rules (:data:`RULES` under ``estimator.``) for every ``baselines`` entry the run reads
    (:func:`used_baselines`), named as ``baselines.<key>.<setting>``."""
    named = [*cfg["compare_with"], *(cfg["protocol"].get("estimators") or [])]
    for name in used_baselines(cfg["estimator"], cfg.get("baselines"), named):
        entry = {"estimator": (cfg.get("baselines") or {}).get(name) or {}}
        for key, (ok, expected) in RULES.items():
            present, value = _lookup(entry, key) if key.startswith("estimator.") else (False, None)
            expect(not present or ok(value), f"baselines.{name}.{key.removeprefix('estimator.')}={value!r}; "
                                             f"expected {expected}")


def check_source_names(use: Any) -> None:
    """``sources.use``: null (what the view and the estimators read) or a list of known sources."""
    from mice_exp.llm.sources import SOURCES  # loads numpy, hydra: the value rules import no computation

    if use is not None and (not isinstance(use, list) or not set(use) <= set(SOURCES)):
        raise UserError(f"sources.use={use}; expected null (what the view and the estimators read) or a list of "
                        f"{', '.join(SOURCES)}")


def settle_sources(use: Sequence[str] | None, readers: Sequence[tuple[str, Needs]]) -> list[str]:
    """``sources.use`` as the run computes it: null derives it from what the ``readers`` (the view and each estimator,
    by name) declare they read; an explicit list may add sources (a records file's, the report's action-belief
    ``acts``) but must hold every read one, or it is refused in one line naming the reader."""
    from mice_exp.llm.sources import SOURCES  # loads numpy, hydra: the value rules import no computation

    check_source_names(use)
    if use is None:
        return [name for name in SOURCES if any(name in needs.sources for _, needs in readers)]
    for who, needs in readers:
        missing = sorted(needs.sources - set(use))
        expect(not missing, f"{who} reads the {', '.join(missing)} confidence source, which "
                            f"sources.use=[{', '.join(use)}] does not compute; expected "
                            f"sources.use=[{', '.join([*use, *missing])}] (or null: what the view and estimators read)")
    return list(use)


def check_config(cfg: dict[str, Any]) -> None:
    """Reject invalid values before anything is built (each check raises a one-line UserError); what the built
    objects must provide each other (needs, internals, gate trust) :meth:`mice_exp.pipeline.Pipeline.check` checks."""
    from mice_exp.llm.settings import LLMSettings  # loads numpy
    from mice_exp.tracking.store import is_enabled, tracking_uri  # loads numpy

    for key in sorted(set(cfg) - set(SETTINGS)):
        raise UserError(f"{key}={cfg[key]!r} is not a setting: nothing reads it (a '+' override adds any key); "
                        "expected one of the config's own, e.g. risk=high or risk.fp=-4 for the threshold")
    if cfg.get("stage", "all") not in STAGES:
        raise UserError(f"stage={cfg.get('stage')!r}; expected one of {', '.join(STAGES)}")
    check_group_keys(cfg)
    check_values(cfg)
    check_risk(cfg["risk"])
    llm = LLMSettings.from_config(cfg["llm"])
    check_llm(llm)
    check_model_folder(llm.source)
    check_baseline_values(cfg)
    check_source_names(cfg["sources"]["use"])
    check_run_shape(cfg["dataset"], cfg["protocol"], cfg.get("stage", "all"))
    if is_enabled(cfg["tracking"]):
        tracking_uri(cfg["tracking"], Path(cfg["paths"].get("root") or "."))


def check_data(selection: Any, split: Mapping[str, Any], schemas: bool, protocol: str, estimates: bool) -> None:
    """What only the data can tell, before the LLM stage: a ``selection`` (:class:`~mice_exp.data.Selection`)
    without training calls under ``dataset.split`` when the run ``estimates``, a single API under
    ``protocol`` loao, tools that cannot be JSON schemas under ``prompt.tools`` schemas.

    Loading the data set costs well under a second; finding out after generation costs the run.
    """
    if estimates:
        expect("train" in selection.splits.values(),
               f"dataset.split={dict(split)} gives no training calls among the {len(selection.examples)} examples; "
               "the estimators need training calls")
    if schemas:
        for example in selection.examples:  # a tool that is no schema: one line now, not after the LLM loads
            _ = example.schemas
    apis = sorted({e.api for e in selection.examples})
    if protocol == "loao":
        expect(len(apis) >= 2, f"protocol=loao needs at least 2 APIs; the data set has only {apis[0]!r}; "
                               "expected more APIs or protocol=holdout")


def check_cache(cache: Path) -> None:
    """``paths.cache`` must be writable: the LLM stage, features and models all live there."""
    from mice_exp.cache import unwritable  # loads numpy

    problem = unwritable(cache)
    expect(problem is None, f"paths.cache={str(cache)!r} is not writable ({problem}); expected a writable "
                            "folder: make it writable or pass paths.cache=/a/writable/folder")
