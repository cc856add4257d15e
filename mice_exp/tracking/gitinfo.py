"""The commit and dirty flag of the checkout a run came from, via the ``git`` command line.

Never raises: outside a repository, without ``git``, or when ``git`` hangs, the commit is
left out and the dirty flag reads ``unknown``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

GIT_TIMEOUT_S = 10.0


def _git(root: Path, *args: str) -> str | None:
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", LC_ALL="C")  # status must not take index.lock
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_tags(root: Path) -> dict[str, str]:
    """``git.commit`` (and MLflow's ``mlflow.source.git.commit``) and ``git.dirty``.

    Dirty means tracked changes or untracked files that are not ignored: either can change
    a result, and neither is recorded by the commit hash.
    """
    tags: dict[str, str] = {}
    commit = _git(root, "rev-parse", "--verify", "HEAD")
    if commit and commit.strip():
        tags["git.commit"] = tags["mlflow.source.git.commit"] = commit.strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=normal")
    tags["git.dirty"] = "unknown" if status is None else ("true" if status.strip() else "false")
    return tags
