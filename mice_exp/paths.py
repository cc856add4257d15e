"""Absolute paths for a run: project root, caches, tracking store (hydra.job.chdir stays false)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mice_exp.errors import UserError

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
    least of all), no existing file replaced unless ``force``, and its folder writable (created if missing)."""
    if value is None or not str(value).strip():
        raise UserError(f"{setting} is empty; expected the path of a file to write")
    path = resolve(str(value), root)
    if path.is_dir():
        raise UserError(f"{setting}={str(value)!r} is a folder ({path}); expected the path of a file to write")
    if path.exists() and not force:
        raise UserError(f"{setting}={str(value)!r}: {path} exists; pass force=true to replace it")
    _writable(path.parent, setting, value)
    return path


def writable_folder(value: str | Path, base: Path, setting: str) -> Path:
    """A folder an output setting names (relative to ``base``), created and checked for writing before any work;
    never the project folder or one above it, from whichever folder the command runs."""
    if not str(value).strip():
        raise UserError(f"{setting} is empty; expected a folder to write into")
    path, project = resolve(str(value), base), project_root()
    if path == project or path in project.parents:
        raise UserError(f"{setting}={str(value)!r} is the project folder {project} or one above it; "
                        "expected a folder of its own")
    if path.is_file():
        raise UserError(f"{setting}={str(value)!r} is a file; expected a folder to write into")
    _writable(path, setting, value)
    return path


def _writable(folder: Path, setting: str, value: str | Path) -> None:
    """Create ``folder`` if missing; one line if that or writing in it fails (:func:`mice_exp.cache.unwritable`)."""
    from mice_exp.cache import unwritable  # loads numpy

    problem = unwritable(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        problem = problem or f"{folder}: {error.strerror or error}"
    if problem:
        raise UserError(f"{setting}={str(value)!r}: cannot write there ({problem}); expected a writable place")
