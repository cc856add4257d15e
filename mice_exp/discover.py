"""The classes a config group's ``_target_`` may name, found by walking their package: a new one is its module
(or an export of the package), with no list to extend; a gate trusts exactly these when it loads a file."""

from __future__ import annotations

import importlib
import pkgutil
from inspect import isabstract
from typing import Any, Iterable, Mapping


def type_path(cls: type) -> str:
    """A class as ``_target_`` and ``gate.json`` name it."""
    return f"{cls.__module__}.{cls.__qualname__}"


def class_path(obj: Any) -> str:
    return type_path(type(obj))


def package_classes(package: str, path: Iterable[str], base: type, exported: Mapping[str, object]) -> list[type]:
    """Every concrete subclass of ``base`` defined in a module of ``package`` (on ``path``, its ``__path__``) or
    ``exported`` by it (its ``globals()``: one defined elsewhere), each once, in the order found."""
    def concrete(namespace: Mapping[str, object]) -> list[type]:
        return [c for c in namespace.values()
                if isinstance(c, type) and issubclass(c, base) and c is not base and not isabstract(c)]

    modules = [importlib.import_module(f"{package}.{info.name}") for info in pkgutil.iter_modules(path)]
    found = [c for module in modules for c in concrete(vars(module)) if c.__module__ == module.__name__]
    return list(dict.fromkeys([*found, *concrete(exported)]))
