"""Load STE's test set (Wang et al., 2024), the data set the MICE paper evaluates on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mice_exp.data.dataset import Dataset
from mice_exp.data.download import download
from mice_exp.data.labels import EXACT_MATCH, ExactMatch
from mice_exp.data.records import Example, Labels, format_demo
from mice_exp.errors import UserError
from mice_exp.paths import Paths

# Where the shared data lives relative to the project root (the repo folder).
SHARED_RELATIVE_PATH = Path("..") / "shared" / "data" / "ste" / "tool_test.json"


class Ste(ExactMatch, Dataset):
    """STE's test set (``conf/dataset/ste.yaml``), labelled by exact match as in the MICE paper."""

    name = "ste"

    def __init__(self, url: str, sha256: str, path: str | None = None, **common: Any) -> None:
        super().__init__(**common)
        self.path, self.url, self.sha256 = path, url, sha256

    def load(self, paths: Paths) -> list[Example]:
        return load_ste(resolve_ste_path(self.path, paths.root, paths.data, self.url, self.sha256), self)

    def source(self) -> str:
        return f"dataset.path={self.path!r}" if self.path is not None else f"dataset=ste ({SHARED_RELATIVE_PATH})"


def resolve_ste_path(
    path: str | Path | None, project_root: Path, cache_dir: Path, url: str, sha256: str
) -> Path:
    """Find tool_test.json: ``path`` if given (relative to ``project_root``), else the
    shared copy next to the project, else a sha256-checked download into ``cache_dir``."""
    if path is not None:
        given = project_root / Path(path)  # an absolute path stays absolute
        if not given.is_file():
            raise UserError(f"dataset.path={str(path)!r}: no such file {given} (expected STE's tool_test.json)")
        return given
    shared = project_root / SHARED_RELATIVE_PATH
    if shared.is_file():
        return shared
    cached = cache_dir / "ste" / "tool_test.json"
    if not cached.is_file():
        download(url, cached, sha256)
    return cached


def load_ste(path: Path, labels: Labels = EXACT_MATCH) -> list[Example]:
    """Read STE's ``{api: [example, ...]}`` file, in file order, one Example per query.

    The gold ``action_input`` (a JSON string) is parsed once here so the labeler compares
    values, not text; the demo keeps the original string, as STE's demonstrations do.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{path}: cannot read STE data ({error}); expected a JSON file") from error
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object mapping API name -> list of examples")
    examples = []
    for api, items in data.items():
        if not isinstance(items, list):
            raise UserError(f"{path}: API {api!r} maps to {type(items).__name__}, expected a list of examples")
        examples.extend(_example(path, api, index, item, labels) for index, item in enumerate(items))
    return examples


def _example(path: Path, api: str, index: int, item: Any, labels: Labels) -> Example:
    """Build one Example, naming the file, API and position when a field is wrong."""
    try:
        action_input = json.loads(item["action_input"])
        if not isinstance(action_input, dict):
            raise TypeError("action_input is not a JSON object")
        return Example(
            id=f"ste/{api}/{index}",
            dataset="ste",
            api=api,
            query=str(item["query"]),
            tools=str(item["api_descriptions"]),
            tool_names=tuple(str(name) for name in item["API_name_list"]),
            gold={"action": str(item["action"]), "action_input": action_input},
            demo=format_demo(str(item["action"]), item["action_input"]),
            labels=labels,
        )
    except (KeyError, TypeError, json.JSONDecodeError) as error:
        raise UserError(
            f"{path}: example {index} of API {api!r} is malformed ({error!r}); expected keys query, "
            "API_name_list, api_descriptions, action and action_input (a JSON object string)"
        ) from error
