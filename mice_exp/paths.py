"""Absolute paths for a run: project root, caches, tracking store (hydra.job.chdir stays false)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def project_root() -> Path:
    """The checkout holding ``conf/`` when run from source, else the working directory."""
    return PACKAGE_ROOT if (PACKAGE_ROOT / "conf").is_dir() else Path.cwd()


@dataclass(frozen=True)
class Paths:
    root: Path
    cache: Path

    @property
    def models(self) -> Path:
        return self.cache / "models"

    @property
    def llm(self) -> Path:
        return self.cache / "llm"

    @property
    def features(self) -> Path:
        return self.cache / "features"

    @property
    def data(self) -> Path:
        return self.cache / "data"


def resolve(path: str | Path, root: Path) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() else (root / path).resolve()


def paths_from(cfg: Mapping[str, Any]) -> Paths:
    root = resolve(cfg.get("root") or project_root(), Path.cwd())
    return Paths(root=root, cache=resolve(cfg.get("cache", ".cache"), root))


def writable_file(value: str | Path | None, root: Path, setting: str, force: bool = False) -> Path:
    """The file an output setting names, checked before any work: not empty, not a folder (the project's
    least of all), its folder creatable and writable, and no existing file replaced unless ``force``."""
    from mice_exp.errors import UserError

    if value is None or not str(value).strip():
        raise UserError(f"{setting} is empty; expected the path of a file to write")
    path = resolve(str(value), root)
    if path.is_dir():
        raise UserError(f"{setting}={str(value)!r} is a folder ({path}); expected the path of a file to write")
    if path.exists() and not force:
        raise UserError(f"{setting}={str(value)!r}: {path} exists; pass force=true to replace it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"{setting}={str(value)!r}: cannot create its folder {path.parent} "
                        f"({error.strerror or error}); expected a writable place") from None
    _can_write(path.parent, setting, value)
    return path


def writable_folder(value: str | Path, root: Path, setting: str) -> Path:
    """A folder an output setting names, created and checked for writing before any work; never the project."""
    from mice_exp.errors import UserError

    if not str(value).strip():
        raise UserError(f"{setting} is empty; expected a folder to write into")
    path = resolve(str(value), root)
    if path == root or path in root.parents:
        raise UserError(f"{setting}={str(value)!r} is the project folder {path} or above it; expected a folder of its own")
    if path.is_file():
        raise UserError(f"{setting}={str(value)!r} is a file; expected a folder to write into")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"{setting}={str(value)!r}: cannot create {path} ({error.strerror or error}); "
                        "expected a writable place") from None
    _can_write(path, setting, value)
    return path


def _can_write(folder: Path, setting: str, value: str | Path) -> None:
    """Write and remove a scratch file in ``folder``: the one check that a read-only mount, permissions and
    a full disk all fail alike."""
    from mice_exp.errors import UserError

    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise UserError(f"{setting}={str(value)!r}: cannot write in {folder} ({error.strerror or error}); "
                        "expected a writable place") from None
