"""The recipes of docs/extending.md, done for real by the tests: each recipe's files are the page's own code blocks,
so the page cannot drift from what the tests run."""

from __future__ import annotations

import importlib
import re
import shutil
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from mice_exp import compose, config
from mice_exp.paths import PACKAGE_ROOT

EXTENDING = PACKAGE_ROOT / "docs" / "extending.md"
#: A file of a recipe: a fenced block whose first line is a comment naming the file's path in the checkout.
BLOCK = re.compile(r"```(?:python|yaml)\n# (\S+)[^\n]*\n(.*?)```", flags=re.S)


def recipe(section: str) -> dict[str, str]:
    """The files the recipe ``## <section>`` of docs/extending.md writes or adds to, by their path."""
    body = EXTENDING.read_text(encoding="utf-8").split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return dict(BLOCK.findall(body))


def follow_recipe(section: str, checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Do the recipe ``## <section>`` in ``checkout``, for this test only: its conf/ a copy of this one's, which every
    config is composed and checked from, with the recipe's YAML files written (or added to the end of the file they
    name); each new module written beside its package and joined to the package's ``__path__`` (it imports by its
    name in the checkout); each block for a module that exists run in it, adding its entries to the module's tables."""
    shutil.copytree(PACKAGE_ROOT / "conf", checkout / "conf", dirs_exist_ok=True)
    for module in (compose, config):
        monkeypatch.setattr(module, "project_root", lambda: checkout)
        for name, value in list(vars(module).items()):
            if hasattr(value, "cache_clear"):  # what it read of conf/ once, read again from the checkout's
                monkeypatch.setattr(module, name, cache(value.__wrapped__))
    for path, text in recipe(section).items():
        name = path.removesuffix(".py").replace("/", ".")
        if path.endswith(".py") and (PACKAGE_ROOT / path).exists():
            add_entries(importlib.import_module(name), text, monkeypatch)
            continue
        target = checkout / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a", encoding="utf-8") as file:
            file.write(text)
        if path.endswith(".py"):
            package = importlib.import_module(name.rpartition(".")[0])
            monkeypatch.setattr(package, "__path__", [*package.__path__, str(target.parent)])
            monkeypatch.setitem(sys.modules, name, importlib.import_module(name))  # forgotten after the test


def add_entries(module: ModuleType, block: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``block`` run as if added to the end of ``module``; the entries it adds to the module's tables
    (``SOURCES["says_yes"] = ...``) are put there for this test only."""
    tables = {name: dict(value) for name, value in vars(module).items()
              if isinstance(value, dict) and not name.startswith("__")}
    exec(compile(block, f"docs/extending.md: {module.__name__}", "exec"), {**vars(module), **tables})
    for name, table in tables.items():
        for key in table.keys() - getattr(module, name).keys():
            monkeypatch.setitem(getattr(module, name), key, table[key])
