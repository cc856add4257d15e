"""Load a user's own tool-calling data: one JSON object per line, labelled like STE.

Each line: ``{"id", "api", "query", "tools", "gold": {"action", "action_input"}}``.
``tools`` is either the prompt text (then the names come from ``tool_names``, or from
STE-style ``API_name: <name>`` lines) or a list of tool dicts, each with a ``name``,
shown as indented JSON. ``action_input`` is a JSON object or a string holding one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mice_exp.data.dataset import Dataset
from mice_exp.data.labels import EXACT_MATCH, ExactMatch
from mice_exp.data.records import Example, Labels, format_demo
from mice_exp.data.schemas import function_of
from mice_exp.errors import UserError
from mice_exp.paths import Paths

_STE_NAME_LINE = re.compile(r"^API_name:\s*(.+?)\s*$", re.MULTILINE)


class Jsonl(ExactMatch, Dataset):
    """A user's own file (``conf/dataset/jsonl.yaml``), labelled like STE."""

    name = "jsonl"

    def __init__(self, path: str | None, **common: Any) -> None:
        super().__init__(**common)
        if path is None:
            raise UserError("dataset.path is null; expected the path of a JSON-lines file")
        self.path = path

    def load(self, paths: Paths) -> list[Example]:
        return load_jsonl(paths.root / Path(self.path), self)

    def source(self) -> str:
        return f"dataset.path={str(self.path)!r}"


def load_jsonl(path: Path, labels: Labels = EXACT_MATCH) -> list[Example]:
    """Examples in file order; blank lines are skipped, ids must be unique."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"dataset.path: cannot read {path} ({error}); expected a JSON-lines file") from error
    examples: list[Example] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        example = _parse_line(path, number, line, labels)
        if example.id in seen:
            raise UserError(f"{path}:{number}: duplicate id {example.id.rsplit('/', 1)[1]!r} for api {example.api!r}")
        seen.add(example.id)
        examples.append(example)
    return examples


def _parse_line(path: Path, number: int, line: str, labels: Labels) -> Example:
    """One line -> Example; any problem is a UserError naming ``path:number``."""
    where = f"{path}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise UserError(f"{where}: not valid JSON ({error.msg}); expected one JSON object per line") from error
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [key for key in ("id", "api", "query", "tools", "gold") if key not in record]
    if missing:
        raise UserError(f"{where}: missing key(s) {missing}; expected id, api, query, tools and gold")
    api, query = record["api"], record["query"]
    if not isinstance(api, str) or not api or not isinstance(query, str):
        raise UserError(f"{where}: 'api' must be a non-empty string and 'query' a string")
    if not isinstance(record["id"], (str, int)) or isinstance(record["id"], bool):
        raise UserError(f"{where}: 'id' must be a string or an integer, got {record['id']!r}")
    tools, tool_names = parse_tools(where, record)
    action, action_input, demo_input = _gold(where, record["gold"])
    if action not in tool_names:
        raise UserError(f"{where}: gold action {action!r} is not among the tools {list(tool_names)}")
    return Example(
        id=f"jsonl/{api}/{record['id']}",
        dataset="jsonl",
        api=api,
        query=query,
        tools=tools,
        tool_names=tool_names,
        gold={"action": action, "action_input": action_input},
        demo=format_demo(action, demo_input),
        labels=labels,
    )


def parse_tools(where: str, record: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The prompt text of the tools and the names allowed after ``Action:``."""
    tools = record["tools"]
    if isinstance(tools, str):
        names = record.get("tool_names", _STE_NAME_LINE.findall(tools))
        if not names or not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise UserError(
                f"{where}: 'tools' is text, so give 'tool_names' (a list of strings) "
                "or name each tool on an 'API_name: <name>' line"
            )
        return tools, tuple(names)
    if isinstance(tools, list) and tools and all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
        for tool in tools:  # one line for a tool no prompt could show as a schema, not a traceback or a bad prompt
            function_of(tool, where)
        return json.dumps(tools, indent=4, ensure_ascii=False), tuple(t["name"] for t in tools)
    raise UserError(f"{where}: 'tools' must be a string or a non-empty list of objects that each have a string 'name'")


def _gold(where: str, gold: Any) -> tuple[str, dict[str, Any], str | dict[str, Any]]:
    """(action, parsed arguments, arguments as the demo shows them)."""
    if not isinstance(gold, dict) or not isinstance(gold.get("action"), str) or "action_input" not in gold:
        raise UserError(f"{where}: 'gold' must be an object with a string 'action' and an 'action_input'")
    shown = gold["action_input"]
    try:
        arguments = json.loads(shown) if isinstance(shown, str) else shown
    except json.JSONDecodeError as error:
        raise UserError(f"{where}: gold 'action_input' string is not valid JSON ({error.msg})") from error
    if not isinstance(arguments, dict):
        raise UserError(f"{where}: gold 'action_input' must be a JSON object, got {type(arguments).__name__}")
    return gold["action"], arguments, shown
