"""Shared fixtures: the project's model cache (conversions are reused across tests) and tiny models."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from mice_exp.paths import PACKAGE_ROOT, Paths

CONF = PACKAGE_ROOT / "conf"
MODELS_CACHE = PACKAGE_ROOT / ".cache" / "models"


@pytest.fixture(autouse=True)
def no_log_handler_on_a_closed_stream():
    """A command run in this process (``mice-exp`` through Hydra) points the root logger's console handler at
    the stream pytest captured for that test, which closes with it; a later test's log line would then print
    logging's own "--- Logging error ---" traceback. Such handlers are dropped before each test."""
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in list(getattr(logger, "handlers", ())):
            if getattr(getattr(handler, "stream", None), "closed", False):
                logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def models_converted_once(monkeypatch):
    """Every ``Paths`` of a test, whatever its fresh ``paths.cache``, keeps converted models in the project's
    ``.cache/models``: converting SmolLM2's packaged GGUF (tiny_random's tokenizer) costs 30-90 s, and a test
    that builds its stage on a tmp cache converted it again. The conversion itself is tested on its own folder
    (``test_bad_input.test_a_gguf_conversion_says_so_before_it_starts``); a ``mice-exp`` subprocess shares it
    through :func:`cache_sharing_models`."""
    monkeypatch.setattr(Paths, "models", property(lambda self: MODELS_CACHE))


def cache_sharing_models(folder: Path) -> Path:
    """A fresh cache folder whose models/ is the project's, so a ``mice-exp`` subprocess on it converts no model
    again (in this process every ``Paths`` shares them already: :func:`models_converted_once`)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "models").exists():
        MODELS_CACHE.mkdir(parents=True, exist_ok=True)
        (folder / "models").symlink_to(MODELS_CACHE)
    return folder


def stage_of(cfg: dict, paths: Any = None, llm: Any = None, selection: Any = None) -> Any:
    """The LLM stage of a composed config, as a run builds it (``llm``: a model already loaded; ``selection``:
    examples to use instead of the data set's)."""
    from mice_exp.pipeline import Pipeline

    stage = Pipeline.from_config(cfg, paths, llm).stage
    if selection is not None:
        stage.selection = selection
    return stage


def llm_conf(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / "llm" / f"{name}.yaml"), resolve=True)


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's tokenizer (the one tiny_random borrows)."""
    from transformers import AutoTokenizer

    from mice_exp.llm.assets import converted_dir

    tok = AutoTokenizer.from_pretrained(converted_dir(llm_conf("tiny_random")["source"]["tokenizer"], MODELS_CACHE))
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="session")
def tiny_llm():
    from mice_exp.llm.backends import load_llm

    return load_llm(llm_conf("tiny_random"), MODELS_CACHE)


def tiny_run(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict]]:
    """A data set run end to end on tiny_random, small and untracked (a cosine view, MICE LR, no permutation tests):
    the run's result and its LLM stage's records."""
    from mice_exp.compose import compose_config
    from mice_exp.llm.records import read_stage
    from mice_exp.run import run

    result = run(compose_config(["llm=tiny_random", "llm.batch_size=4", "llm.max_new_tokens=6", "features=cosine",
                                 "estimator=mice_lr", "permutations=0", "tracking.enabled=false",
                                 f"paths.cache={cache_sharing_models(tmp_path / 'cache')}", *overrides]))
    return result, read_stage(Path(result["llm_cache"])).records
