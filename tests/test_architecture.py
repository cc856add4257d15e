"""The package's layering: no import cycles, and the estimation side loads without torch.

A cycle that works only because of import order breaks the day someone imports the modules in
another order; a stray torch import makes every estimator fit pay seconds of start-up.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import mice_exp

PACKAGE = Path(mice_exp.__file__).parent


def module_files() -> dict[str, Path]:
    """Every module under mice_exp by dotted name (a package by its own name)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("mice_exp", *path.relative_to(PACKAGE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_names(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """What a module imports, anywhere in its body: `from a import b` is `a.b` where b is a submodule."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, counting the parent packages an import runs."""
    modules = module_files()
    graph = {}
    for name, path in modules.items():
        targets = set()
        own_packages = {name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)}
        for imported in imported_names(name, path, modules):
            parts = imported.split(".")
            if parts[0] != "mice_exp":
                continue
            # importing a.b.c runs a.b's __init__ first, unless a.b is already running (it holds the importer)
            parents = {".".join(parts[:i]) for i in range(2, len(parts))} - own_packages
            targets.update(t for t in parents | {imported} if t in modules)
        graph[name] = targets - {name, "mice_exp"}
    return graph


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


def test_relative_and_submodule_imports_are_resolved():
    graph = import_graph()
    assert "mice_exp.metrics.calibration" in graph["mice_exp.metrics"]  # from .calibration import ...
    sample_efficiency = graph["mice_exp.protocols.sample_efficiency"]  # from mice_exp.estimators.base import ...
    assert {"mice_exp.estimators", "mice_exp.estimators.base"} <= sample_efficiency  # the package runs first
    assert "mice_exp.estimators" not in graph["mice_exp.estimators.mice"]  # its own package is already running


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


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


def test_few_functions_read_the_whole_config():
    """Objects go down, not the config: only the pipeline's builder, the checks and a few entry points read two
    or more of its top-level keys (benchmarks/config_reads.py lists them; docs/layout.md says which)."""
    done = subprocess.run([sys.executable, "benchmarks/config_reads.py", "--at-most", "6"], capture_output=True,
                          text=True, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stdout + done.stderr
