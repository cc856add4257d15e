"""The README stays a front page (details live in docs/), and what it links to exists."""

from __future__ import annotations

import re

from mice_exp.paths import PACKAGE_ROOT

README = PACKAGE_ROOT / "README.md"
#: What the README may weigh: the set-up commands, a sweep, MLflow and the headline results; the rest is in docs/.
MAX_README_BYTES = 15_000


def test_the_readme_is_at_most_15_kb():
    assert len(README.read_bytes()) <= MAX_README_BYTES


def test_every_relative_link_of_the_readme_and_docs_resolves():
    """Details moved out of the README keep their links working, in both directions."""
    missing = []
    for page in [README, *sorted((PACKAGE_ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path) and not (page.parent / path).exists():
                missing.append(f"{page.name}: {target}")
    assert missing == []
