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


#: Libraries slow to import or optional: a function may import them where it needs them, so that importing its
#: module stays fast (``mice-exp --help``, the estimation side without torch) and works without the extra.
HEAVY = {"torch", "transformers", "vllm", "bert_score", "mlflow", "matplotlib", "relplot", "sklearn", "scipy", "skops",
         "pandas", "joblib", "numpy", "hydra", "omegaconf", "hydra_plugins", "submitit", "openai", "fastapi",
         "uvicorn", "starlette", "httpx", "pydantic", "huggingface_hub", "agents", "langchain", "langchain_core"}


def unexplained_inner_imports() -> list[str]:
    """``path:line`` of every import inside a function that names no heavy library and says nothing about why
    (a comment on its line: ``# loads torch``, ``# only when a sweep is launched``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                name = node.names[0].name if isinstance(node, ast.Import) else node.module or ""
                text = lines[node.lineno - 1: node.end_lineno]
                if not getattr(node, "level", 0) and name.split(".")[0] in HEAVY or any("#" in line for line in text):
                    continue
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {text[0].strip()}")
    return sorted(set(found))


def test_an_import_inside_a_function_is_a_heavy_library_or_says_why():
    """A module's own imports belong at its top, where a reader sees what it depends on; inside a function only
    what is slow or optional to load, or with its reason beside it."""
    unexplained = unexplained_inner_imports()
    assert not unexplained, "imports inside functions without a reason:\n" + "\n".join(unexplained)


def test_few_functions_read_the_whole_config():
    """Objects go down, not the config: only the pipeline's builder, the checks and a few entry points read two
    or more of its top-level keys (benchmarks/config_reads.py lists them; docs/layout.md says which)."""
    done = subprocess.run([sys.executable, "benchmarks/config_reads.py", "--at-most", "6"], capture_output=True,
                          text=True, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stdout + done.stderr
