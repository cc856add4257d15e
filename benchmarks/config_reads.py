"""Which functions of mice_exp read the run config as a whole: those that index one variable with two or more of
its top-level keys (``cfg["llm"]`` and ``cfg["dataset"]``, ``cfg.get("prompt")`` and ``cfg["seed"]``, ...).

A function that needs the whole config is one that builds from it (``Pipeline.from_config``) or checks it;
everything else should receive the objects, or the one group, it needs (docs/layout.md). Counted per function
(a nested function counts on its own), on any variable name, and on attribute chains too
(``self.cfg["llm"]``); the keys are :data:`mice_exp.config.SETTINGS`. Files that share key names with the config
but are not one (a saved gate's ``gate.json``, a records file's header, rows of MLflow runs) are left out by the
variable that holds them: :data:`NOT_CONFIG`.

    python benchmarks/config_reads.py              # each function and the keys it reads, then the count
    python benchmarks/config_reads.py --at-most 8  # exit status 1 when there are more (tests/test_architecture.py)
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mice_exp.config import SETTINGS  # noqa: E402

#: (module, variable): mappings keyed like the config that are files or rows, not the run config.
NOT_CONFIG = {("mice_exp/gate/gate.py", "spec"), ("mice_exp/gate/gate.py", "s"),
              ("mice_exp/gate/gate.py", "self.spec"), ("mice_exp/gate/loading.py", "spec"),
              ("mice_exp/gate/probability.py", "spec"), ("mice_exp/llm/records.py", "header"),
              ("mice_exp/llm/records.py", "stage_key"),
              ("mice_exp/report/collect.py", "key"), ("mice_exp/report/extras.py", "r.data.tags"),
              ("mice_exp/report/extras.py", "run.data.tags"), ("mice_exp/report/paper_terms.py", "entry"),
              ("mice_exp/report/paper_terms.py", "table")}


def _read(node: ast.AST) -> tuple[str, str] | None:
    """(variable, key) of ``var["key"]`` or ``var.get("key", ...)``, the variable a name or attribute chain."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        base, key = node.value, node.slice.value
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
          and node.args and isinstance(node.args[0], ast.Constant)):
        base, key = node.func.value, node.args[0].value
    else:
        return None
    if not isinstance(base, (ast.Name, ast.Attribute)) or not isinstance(key, str):
        return None
    return ast.unparse(base), key


def wide_readers(root: Path = ROOT) -> list[tuple[str, int, str, dict[str, list[str]]]]:
    """(module, line, function, {variable: top-level keys read}) for every function reading two or more."""
    found = []
    for path in sorted((root / "mice_exp").rglob("*.py")):
        module = path.relative_to(root).as_posix()
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            reads: dict[str, set[str]] = defaultdict(set)
            todo = list(ast.iter_child_nodes(function))
            while todo:
                node = todo.pop()
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue  # counted on its own
                read = _read(node)
                if read and read[1] in SETTINGS and (module, read[0]) not in NOT_CONFIG:
                    reads[read[0]].add(read[1])
                todo.extend(ast.iter_child_nodes(node))
            wide = {var: sorted(keys) for var, keys in reads.items() if len(keys) >= 2}
            if wide:
                found.append((module, function.lineno, function.name, wide))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at-most", type=int, default=None, help="exit 1 when more functions read the whole config")
    args = parser.parse_args()
    found = wide_readers()
    for module, line, name, wide in found:
        print(f"{module}:{line} {name}: " + "; ".join(f"{var}[{', '.join(keys)}]" for var, keys in wide.items()))
    print(f"{len(found)} functions read two or more top-level config keys")
    if args.at_most is not None and len(found) > args.at_most:
        sys.exit(1)


if __name__ == "__main__":
    main()
