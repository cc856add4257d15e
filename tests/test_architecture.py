"""The package's layering: no import cycles, the estimation side loads without torch, an import inside a
function has a reason the test can check, and no module or class grows past a size a reader can hold.

A cycle that works only because of import order breaks the day someone imports the modules in
another order; a stray torch import makes every estimator fit pay seconds of start-up; a reason nobody
checks ("loads torch") goes stale the day the module it names stops loading torch.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Callable, Iterable, Iterator

import mice_exp

PACKAGE = Path(mice_exp.__file__).parent
Import = ast.Import | ast.ImportFrom


def module_files() -> dict[str, Path]:
    """Every module under mice_exp by dotted name (a package by its own name)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("mice_exp", *path.relative_to(PACKAGE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


@cache
def parsed(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for the several walks of one test run."""
    return ast.parse(path.read_text())


def module_level(tree: ast.AST) -> Iterator[Import]:
    """The imports that run when the module is imported: not those inside a function, nor under
    ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, Import):
            yield node
        elif isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            todo += node.orelse
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo += ast.iter_child_nodes(node)


def function_imports(tree: ast.AST) -> list[Import]:
    """The imports inside a function: they run when it is called."""
    found = {}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.update((id(n), n) for n in ast.walk(function) if isinstance(n, Import))
    return list(found.values())


def import_targets(node: Import, name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """What one import statement of module ``name`` imports: ``from a import b`` is ``a.b`` where b is a
    submodule, a relative import is resolved."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    return {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}


def runs(imported: str, importer: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that importing ``imported`` from ``importer`` runs: it, and first its parent
    packages, unless one is already running (it holds the importer)."""
    parts = imported.split(".")
    if parts[0] != "mice_exp":
        return set()
    own_packages = {importer.rsplit(".", i)[0] for i in range(1, importer.count(".") + 1)}
    parents = {".".join(parts[:i]) for i in range(2, len(parts))} - own_packages
    return {t for t in parents | {imported} if t in modules} - {importer, "mice_exp"}


def import_graph(statements: Callable[[ast.AST], Iterable[ast.AST]] = ast.walk) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, counting the parent packages an import runs; ``statements``
    says which of its imports count (by default every one in its body)."""
    modules = module_files()
    return {name: {module for node in statements(parsed(path)) if isinstance(node, Import)
                   for target in import_targets(node, name, path, modules) for module in runs(target, name, modules)}
            for name, path in modules.items()}


def library_imports() -> dict[str, set[str]]:
    """Module -> the libraries (top-level names outside the package) its module-level imports load."""
    modules = module_files()
    return {name: {target.split(".")[0] for node in module_level(parsed(path)) if not getattr(node, "level", 0)
                   for target in import_targets(node, name, path, modules)} - {"mice_exp"}
            for name, path in modules.items()}


def reachable(graph: dict[str, set[str]], start: Iterable[str]) -> set[str]:
    """``start`` and every module they import, directly or not."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph.get(module, ())
    return seen


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that returns to its start, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_reports_the_loop():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_module_level_imports_leave_out_functions_and_type_checking():
    tree = ast.parse("import json\nif TYPE_CHECKING:\n    import torch\nelse:\n    import numpy\n"
                     "class Table:\n    import re\n\ndef plot():\n    import matplotlib\n")
    assert {node.names[0].name for node in module_level(tree)} == {"json", "numpy", "re"}
    assert [node.names[0].name for node in function_imports(tree)] == ["matplotlib"]


def test_relative_and_submodule_imports_are_resolved():
    graph = import_graph()
    assert "mice_exp.metrics.calibration" in graph["mice_exp.metrics"]  # from .calibration import ...
    sample_efficiency = graph["mice_exp.protocols.sample_efficiency"]  # from mice_exp.estimators.base import ...
    assert {"mice_exp.estimators", "mice_exp.estimators.base"} <= sample_efficiency  # the package runs first
    assert "mice_exp.estimators" not in graph["mice_exp.estimators.mice"]  # its own package is already running


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph by folder: a subpackage of mice_exp is one node (``mice_exp.llm``), a module beside them one
    of its own (``mice_exp.run``); an arrow for every module import between two of them."""
    def folder(module: str) -> str:
        return ".".join(module.split(".")[:2])

    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folders.setdefault(folder(module), set()).update(folder(t) for t in targets)
    return {name: targets - {name} for name, targets in folders.items()}


def test_folders_are_the_module_graph_s_first_two_names():
    graph = {"mice_exp.llm.shards": {"mice_exp.launcher.gpus"}, "mice_exp.launcher.gpus": set(),
             "mice_exp.launcher.slurm": {"mice_exp.run"}, "mice_exp.run": {"mice_exp.llm.stage"},
             "mice_exp.llm.stage": {"mice_exp.llm.shards"}}
    assert find_cycle(graph) is None  # no module returns to itself...
    folders = folder_graph(graph)
    assert folders["mice_exp.llm"] == {"mice_exp.launcher"}
    assert find_cycle(folders) == ["mice_exp.launcher", "mice_exp.run", "mice_exp.llm", "mice_exp.launcher"]  # ...but


def test_no_folder_imports_one_that_imports_it_back():
    """A loop between folders (the LLM stage's workers importing the launcher, the launcher the app) passes the
    module check as long as no single module returns to itself, and ties the folders into one."""
    cycle = find_cycle(folder_graph(import_graph()))
    assert cycle is None, "folder-level import loop: " + " -> ".join(cycle)


#: The estimation side and the report: everything after the LLM stage's records.
LIGHT = ["mice_exp.metrics", "mice_exp.estimators", "mice_exp.protocols", "mice_exp.protocols.sample_efficiency",
         "mice_exp.estimation", "mice_exp.report", "mice_exp.report.command", "mice_exp.features",
         "mice_exp.llm.records"]


def loaded_after_import(modules: list[str]) -> set[str]:
    """The top-level packages a fresh interpreter holds after importing `modules`."""
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint(' '.join(sorted({{n.split('.')[0] for n in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent)
    return set(out.stdout.split())


def test_estimation_side_imports_without_torch():
    loaded = loaded_after_import(LIGHT)
    assert "torch" not in loaded
    assert "transformers" not in loaded


def test_estimators_import_without_matplotlib():
    loaded = loaded_after_import(["mice_exp.estimators"])
    assert "matplotlib" not in loaded
    assert "torch" not in loaded


#: Libraries slow to import or optional that the package imports inside functions, itself or through one of its
#: modules, so that importing the caller stays fast (``mice-exp --help``, the estimation side without torch) and
#: works without the extra.
HEAVY = {"torch", "transformers", "vllm", "bert_score", "mlflow", "matplotlib", "relplot", "sklearn", "scipy", "skops",
         "pandas", "joblib", "numpy", "hydra", "omegaconf", "hydra_plugins", "submitit", "openai", "fastapi",
         "uvicorn", "starlette",
         # a host's own package, installed with its extra only (pyproject.toml: claude, adk, inspect, mcp, ...)
         "claude_agent_sdk", "inspect_ai", "google", "mcp", "agents", "langchain", "langchain_core", "langgraph"}


def reason_problem(importer: str, imported: set[str], comment: str, graph: dict[str, set[str]],
                   libraries: dict[str, set[str]]) -> str | None:
    """What is wrong with ``comment`` as the reason a function of ``importer`` imports ``imported`` (the
    package's modules the import runs), or None. It must name libraries of :data:`HEAVY` that those modules
    load at import (``graph``, ``libraries``: module-level imports), every one it names, or an import cycle,
    which must be real: those modules import ``importer`` back."""
    loaded = reachable(graph, imported)
    named = HEAVY & set(re.findall(r"\w+", comment))
    cycle = re.search(r"\bcycle\b", comment) is not None
    if not named and not cycle:
        return "names neither a library of HEAVY that it loads nor an import cycle"
    false = named - set().union(*(libraries.get(module, set()) for module in loaded))
    if false:
        return f"{', '.join(sorted(imported))} loads no {', '.join(sorted(false))} at import"
    if cycle and importer not in loaded:
        return f"no cycle: {', '.join(sorted(imported))} does not import {importer}"
    return None


def test_an_import_reason_is_what_the_imported_module_loads_or_a_real_cycle():
    graph = {"app.cli": {"app.model"}, "app.model": {"app.tensors"}, "app.tensors": set(),
             "app.a": {"app.b"}, "app.b": {"app.a"}}
    libraries = {"app.model": {"json"}, "app.tensors": {"torch", "numpy"}}
    assert reason_problem("app.cli", {"app.model"}, "loads torch", graph, libraries) is None  # through app.tensors
    assert reason_problem("app.cli", {"app.model"}, "loads torch, transformers", graph,
                          libraries) == "app.model loads no transformers at import"
    assert reason_problem("app.cli", {"app.model"}, "only when a sweep is launched", graph, libraries).startswith(
        "names neither")
    assert reason_problem("app.a", {"app.b"}, "an import cycle: app.b imports app.a", graph, libraries) is None
    assert reason_problem("app.cli", {"app.model"}, "breaks an import cycle", graph,
                          libraries) == "no cycle: app.model does not import app.cli"


def unchecked_inner_imports() -> list[str]:
    """``path:line import: problem`` for every import inside a function that is neither of a :data:`HEAVY`
    library itself nor one of the package's modules with a comment on its line that :func:`reason_problem`
    confirms (``# loads torch``)."""
    modules = module_files()
    graph, libraries = import_graph(module_level), library_imports()
    found = []
    for name, path in sorted(modules.items()):
        lines = path.read_text().splitlines()
        for node in function_imports(parsed(path)):
            targets = import_targets(node, name, path, modules)
            if not getattr(node, "level", 0) and all(t.split(".")[0] in HEAVY for t in targets):
                continue
            text = lines[node.lineno - 1: node.end_lineno]
            comment = " ".join(line.split("#", 1)[1] for line in text if "#" in line)
            imported = {module for target in targets for module in runs(target, name, modules)}
            problem = (reason_problem(name, imported, comment, graph, libraries) if imported else
                       "a library outside HEAVY: import it at the module's top")
            if problem:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {text[0].strip()}: {problem}")
    return found


def test_an_import_inside_a_function_is_a_heavy_library_or_says_why():
    """A module's own imports belong at its top, where a reader sees what it depends on; inside a function only
    what is slow or optional to load, or with a reason beside it that is checked to be true."""
    unchecked = unchecked_inner_imports()
    assert not unchecked, "imports inside functions without a true reason:\n" + "\n".join(unchecked)


MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 250


def oversized() -> dict[str, int]:
    """The length in lines of every module over :data:`MAX_MODULE_LINES` (by path) and every class over
    :data:`MAX_CLASS_LINES` (``path:Class``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE.parent))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES:
            found[where] = lines
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef) and (lines := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                found[f"{where}:{node.name}"] = lines
    return found


def test_no_module_or_class_is_too_long_to_read():
    """A module over 450 lines or a class over 250 holds more than one concern: split it by concern, as
    ``gate/`` is (the HTTP app, the OpenAI protocol, the batching service, the confirm / hold policy)."""
    over = oversized()
    assert not over, f"over {MAX_MODULE_LINES} lines a module or {MAX_CLASS_LINES} a class: {over}"


def test_few_functions_read_the_whole_config():
    """Objects go down, not the config: only the pipeline's builder, the checks and a few entry points read two
    or more of its top-level keys (benchmarks/config_reads.py lists them; docs/layout.md says which)."""
    done = subprocess.run([sys.executable, "benchmarks/config_reads.py", "--at-most", "6"], capture_output=True,
                          text=True, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stdout + done.stderr


#: The config groups read through their frozen settings (:mod:`mice_exp.llm.settings`), under the names they travel by:
#: ``llm``, ``stage.prompt``, ``llm_cfg``, ``gate.prompt_settings`` or ``cfg["retrieval"]``.
SETTINGS_GROUP = re.compile(r"(llm|prompt|retrieval)(_cfg|_settings)?")
SETTINGS_MODULE = PACKAGE / "llm" / "settings.py"


def holds_a_group(node: ast.AST) -> bool:
    """Whether an expression names one of the groups: a name or attribute of :data:`SETTINGS_GROUP`, or a subscript
    with one as a string (``cfg["llm"]``, ``spec["prompt"]``)."""
    if isinstance(node, ast.Subscript):
        name = node.slice.value if isinstance(node.slice, ast.Constant) else None
    else:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return isinstance(name, str) and SETTINGS_GROUP.fullmatch(name) is not None


def literal_key_reads(tree: ast.AST) -> list[ast.AST]:
    """The reads of a group's key by its literal name: ``group["key"]`` or ``group.get("key", ...)``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            key, group = node.slice, node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            key, group = (node.args or [None])[0], node.func.value
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and holds_a_group(group):
            found.append(node)
    return found


def test_a_literal_key_read_of_a_group_is_found():
    tree = ast.parse('a = llm["batch_size"]\nb = stage.prompt.get("tools", "text")\nc = cfg["llm"]["name"]\n'
                     'd = self.llm_cfg["device"]\nok = llm.batch_size, prompts["x"], prompt[-1], cfg["llm"]\n')
    assert [ast.unparse(node) for node in literal_key_reads(tree)] == [
        "llm['batch_size']", "stage.prompt.get('tools', 'text')", "cfg['llm']['name']", "self.llm_cfg['device']"]


def test_the_llm_prompt_and_retrieval_groups_are_read_through_their_settings():
    """Each group is one frozen object with its defaults and derived values (the prompt budget, schema tools, the
    cache key's parts): a key read by its name anywhere else would bring back a second default or a second
    derivation."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)}"
             for path in sorted(PACKAGE.rglob("*.py")) if path != SETTINGS_MODULE
             for node in literal_key_reads(parsed(path))]
    assert not found, "config groups read by key outside mice_exp/llm/settings.py:\n" + "\n".join(found)
