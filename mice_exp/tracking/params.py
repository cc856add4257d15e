"""Nested config -> MLflow params: dotted keys, string values, within MLflow's limits.

Pure Python (no MLflow import) so it is cheap to call and easy to test.

MLflow params are strings, immutable once logged, keys at most 250 characters from
``[A-Za-z0-9_.- ]`` (plus ``/`` and ``:`` on some platforms) and values at most 6000
characters. The rules here:

* nested mappings become dotted keys: ``{"llm": {"name": "x"}}`` -> ``llm.name = x``;
* a list of scalars stays one value written as JSON (``[1, 2, 3]``) so it reads and searches
  as one param; a list holding mappings or lists is indexed (``layers.0.name``);
* scalars are written as in YAML / Hydra overrides: ``true``, ``false``, ``null``, ``0.1``;
* empty containers are kept as ``{}`` / ``[]`` so a key never silently disappears;
* characters MLflow rejects in keys become ``_``; a key that sanitises to one already taken
  (by a valid key, or an earlier sanitised one) gets a short hash of its original spelling; keys longer than 250 characters
  keep a prefix and a hash;
* values longer than 6000 characters keep a prefix and end in a marker that says how long the
  value was and gives a hash of the whole (the full config is logged as an artifact besides).

The result is sorted by key, so it depends only on the config's content, not on the order in
which its keys were inserted.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mice_exp.jsonable import jsonable

#: MLflow's limits (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH / MAX_ENTITY_KEY_LENGTH).
MAX_PARAM_VALUE_LENGTH = 6000
MAX_KEY_LENGTH = 250
#: log_batch accepts at most 100 params or tags per call.
MAX_PARAMS_PER_BATCH = 100
#: MLflow truncates tag values at 8000 characters; we stay under it ourselves.
MAX_TAG_VALUE_LENGTH = 5000

_BAD_KEY_CHARS = re.compile(r"[^\w.\- ]")


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def format_value(value: Any) -> str:
    """One scalar (or a list of scalars) as a param string, written as YAML would."""
    value = jsonable(value)  # numpy scalars, paths
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)  # nan, inf, -inf
    if isinstance(value, str):
        return value
    if _is_list(value):
        return "[" + ", ".join(json.dumps(_list_item(v), ensure_ascii=False) for v in value) + "]"
    return str(value)


def _list_item(value: Any) -> Any:
    """One item of a list param (already :func:`jsonable`) as JSON writes it: a non-finite float or a value JSON
    has no type for as a string."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, Mapping) and not _is_list(value)


def _to_container(cfg: Any) -> Any:
    try:  # a DictConfig / ListConfig: resolve interpolations into plain containers
        from omegaconf import Container, OmegaConf

        if isinstance(cfg, Container):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return cfg


def _walk(node: Any, prefix: str, out: list[tuple[str, str]]) -> None:
    if isinstance(node, Mapping):
        if not node and prefix:
            out.append((prefix, "{}"))
        for key, value in node.items():
            _walk(value, f"{prefix}.{key}" if prefix else str(key), out)
    elif _is_list(node) and not all(_is_scalar(v) for v in node):  # never empty here
        for index, value in enumerate(node):
            _walk(value, f"{prefix}.{index}" if prefix else str(index), out)
    else:
        out.append((prefix or "value", format_value(node)))


def sanitize_key(key: str) -> str:
    """A key MLflow accepts: bad characters become ``_``, at most 250 characters."""
    clean = _BAD_KEY_CHARS.sub("_", key) or "_"
    if clean.startswith(".."):
        clean = "_" + clean
    if clean == ".":
        clean = "_"
    if len(clean) > MAX_KEY_LENGTH:
        clean = clean[: MAX_KEY_LENGTH - 10] + "~" + _digest(key)
        clean = _BAD_KEY_CHARS.sub("_", clean)
    return clean


def truncate(value: str, limit: int = MAX_PARAM_VALUE_LENGTH) -> str:
    """``value`` cut to ``limit`` characters, ending in a marker with its length and hash."""
    if len(value) <= limit:
        return value
    marker = f"...[truncated: {len(value)} chars, sha1 {_digest(value, 12)}]"
    return value[: limit - len(marker)] + marker


def flatten_params(cfg: Any, prefix: str = "") -> dict[str, str]:
    """Flatten a (resolved) nested config into unique, valid, sorted MLflow params."""
    pairs: list[tuple[str, str]] = []
    _walk(_to_container(cfg), prefix, pairs)
    params: dict[str, str] = {}
    origin: dict[str, str] = {}
    # Keys that are already valid keep their names; sanitised ones come after, sorted, so that
    # collisions resolve the same way every time.
    for raw_key, value in sorted(pairs, key=lambda kv: (sanitize_key(kv[0]) != kv[0], kv[0])):
        key = sanitize_key(raw_key)
        if key in params and origin[key] != raw_key:
            key = sanitize_key(f"{key[: MAX_KEY_LENGTH - 10]}_{_digest(raw_key, 6)}")
        origin[key] = raw_key
        params[key] = truncate(value)
    return dict(sorted(params.items()))


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> tuple[dict[str, float], list[str]]:
    """Nested metrics -> ``{dotted key: float}``, and the keys skipped for not being numbers."""
    values: dict[str, float] = {}
    skipped: list[str] = []
    for key, value in metrics.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            sub, bad = flatten_metrics(value, name)
            values.update(sub)
            skipped.extend(bad)
            continue
        value = jsonable(value)  # numpy scalars
        if isinstance(value, (bool, int, float)):
            values[sanitize_key(name)] = float(value)
        else:
            skipped.append(name)
    return values, skipped
