"""A gate's input: one query with its tool descriptions, as a dict or a JSON line.

``{"id": ..., "query": "...", "tools": <STE-style text | list of tool dicts>, "tool_names": [...]?}``

``tools`` follows the jsonl data set (:mod:`mice_exp.data.jsonl`): text whose tools are named
on ``API_name: <name>`` lines (or by ``tool_names``), or a list of objects that each have a
string ``name``. Problems are :class:`UserError` s naming the line, so a batch can report
them per line and go on.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mice_exp.data.jsonl import parse_tools
from mice_exp.data.records import Example
from mice_exp.errors import UserError


@dataclass(frozen=True)
class BadLine:
    """A line of a batch file that is not a JSON object: answered with its error."""

    id: Any
    error: str


def query_id(item: Any, index: int) -> Any:
    """The caller's id of a query (its position when it has none)."""
    if isinstance(item, BadLine):
        return item.id
    if isinstance(item, dict) and isinstance(item.get("id"), (str, int)) and not isinstance(item.get("id"), bool):
        return item["id"]
    return index


def parse_query(item: Any, index: int, where: str | None = None) -> Example:
    """One query as the :class:`Example` the prompt builder takes (no gold: it is unknown)."""
    where = where or (f"query {query_id(item, index)!r}" if query_id(item, index) != index else f"query #{index}")
    if isinstance(item, BadLine):
        raise UserError(item.error)
    if not isinstance(item, dict):
        raise UserError(f"{where}: expected a JSON object with query and tools, got {type(item).__name__}")
    missing = [key for key in ("query", "tools") if key not in item]
    if missing:
        raise UserError(f"{where}: missing key(s) {missing}; expected query and tools (and optionally id, tool_names)")
    if not isinstance(item["query"], str) or not item["query"].strip():
        raise UserError(f"{where}: 'query' must be a non-empty string")
    if "id" in item and (not isinstance(item["id"], (str, int)) or isinstance(item["id"], bool)):
        raise UserError(f"{where}: 'id' must be a string or an integer, got {item['id']!r}")
    tools, names = parse_tools(where, item)
    return Example.unlabelled(index, item["query"], tools, tuple(names))


def read_queries(path: str | Path) -> tuple[list[dict[str, Any] | BadLine], list[str]]:
    """The queries of a JSON-lines file (``-``: standard input) and where each one is (``file:line``).

    Lines that are not JSON objects become :class:`BadLine` s, so the others still run. Blank
    lines are skipped.
    """
    if str(path) == "-":
        text, name = sys.stdin.read(), "<stdin>"
    else:
        try:
            text, name = Path(path).read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as error:
            raise UserError(f"input={path}: cannot read it ({error}); expected a JSON-lines file of queries") from None
    items: list[dict[str, Any] | BadLine] = []
    places: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        places.append(f"{name}:{number}")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            items.append(BadLine(f"line {number}", f"{name}:{number}: not valid JSON ({error.msg}); "
                                                   "expected one JSON object per line"))
            continue
        if not isinstance(record, dict):
            items.append(BadLine(f"line {number}", f"{name}:{number}: expected a JSON object, got {type(record).__name__}"))
            continue
        items.append(record)
    return items, places
