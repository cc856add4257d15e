"""Absolute paths for a run: project root, caches, tracking store (hydra.job.chdir stays false)."""

from __future__ import annotations

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
