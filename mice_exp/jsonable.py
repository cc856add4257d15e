"""Values as JSON and YAML hold them: what ``gate.json``, an MLflow artifact or a param is written from.

Its own module, below everything that writes one (the gate's artifact, the tracker's params and artifacts),
so that each imports it without importing the others; it imports nothing of mice_exp, nor numpy itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any


def jsonable(value: Any) -> Any:
    """``value`` in plain containers and Python scalars: mappings (an OmegaConf config resolved) as dicts with
    string keys, lists and tuples as lists, numpy scalars and arrays as Python numbers and lists, paths as
    strings; anything else as it is. ``json.dumps`` of a numpy integer fails, and ``default=str`` would write
    it as a string."""
    from omegaconf import Container, OmegaConf  # loads yaml: only where a value is written

    def plain(value: Any) -> Any:
        if isinstance(value, Container):
            value = OmegaConf.to_container(value, resolve=True)
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if callable(getattr(value, "tolist", None)):  # numpy scalars and arrays
            return value.tolist()
        if isinstance(value, PurePath):
            return str(value)
        return value

    return plain(value)
