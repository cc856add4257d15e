"""docs/hosts.md's code blocks, for the tests that run each one as written (tests/test_hosts*.py): a block's
free names (``GATE``, ``GATE_URL``, ``MODEL``, ``TASK``, ``ask_the_user``, ...) come from the test's namespace."""

from __future__ import annotations

import asyncio
import re
import textwrap
from typing import Any

from mice_exp.paths import PACKAGE_ROOT

#: The longest block the docs show (an example, not a program).
LINES = 15


def code_blocks(section: str, language: str = "python") -> list[str]:
    """The ``language`` code blocks of one section (``## <section>``) of docs/hosts.md, in order; each short."""
    text = (PACKAGE_ROOT / "docs" / "hosts.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(rf"```{language}\n(.*?)```", body, flags=re.S)
    assert all(len(b.strip().splitlines()) <= LINES for b in blocks), section
    return blocks


def run_block(block: str, namespace: dict[str, Any], where: str) -> None:
    """Runs one block in ``namespace`` (what it defines lands there); a block that awaits (``async with``,
    ``await``) runs as the body of an async function, as it would inside the reader's own."""
    if not re.search(r"^\s*(async with|await)\b|\bawait\b", block, flags=re.M):
        exec(compile(block, where, "exec"), namespace)
        return
    body = textwrap.indent(block, "    ") + "    globals().update(locals())\n"
    exec(compile(f"async def _block():\n{body}", where, "exec"), namespace)
    asyncio.run(namespace.pop("_block")())
