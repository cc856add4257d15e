"""Shared fixtures: the project's model cache (conversions are reused across tests) and tiny models."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from mice_exp.paths import PACKAGE_ROOT, Paths


def _a_share_of_the_cores_per_xdist_worker() -> None:
    """Under pytest-xdist (``make test`` runs ``-n 2``) each worker computes with its share of the cores, as the LLM
    stage's own local workers do (``mice_exp.llm.shards.worker_threads``): two workers each spinning torch's and
    OpenBLAS's default of every core would oversubscribe the CPU. Set before numpy or torch loads (each reads it
    once, at import); the ``mice-exp`` subprocesses of the tests inherit it. A value already set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = str(max(1, cores // workers))
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ.setdefault(name, threads)


_a_share_of_the_cores_per_xdist_worker()  # before any test module loads numpy or torch

CONF = PACKAGE_ROOT / "conf"
MODELS_CACHE = PACKAGE_ROOT / ".cache" / "models"

#: Test files whose tests one xdist worker runs as a whole, handed out before the rest (which goes test by test
#: to whichever worker is free): each shares one thing among its tests that costs much to build twice, or that
#: two processes must not use at once. Why, for each:
ONE_WORKER = {
    "tests/test_backends.py": "its server tests share one real `vllm serve` (1-2.5 min to start)",
    "tests/test_slurm.py": "its sweeps share the one-node Slurm cluster; two at once queue for its 2 CPUs",
    "tests/test_demo_pool.py": "its module fixture builds all 750 STE prompts' demonstrations twice (16 s)",
    "tests/test_gate.py": "its module fixture runs a real LLM stage and fits the gate (10 s)",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` (make test) with :data:`ONE_WORKER`'s files as its groups: xdist learns a test's
    ``xdist_group`` mark from a suffix the mark adds to the test's id, which pytest 9.2 no longer lets a plugin
    change (pytest-xdist#1386), so the marks alone would group nothing. Other modes are xdist's own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FilesOnOneWorker(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return file if file in ONE_WORKER else super()._split_scope(nodeid)

    return FilesOnOneWorker(config, log)


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


def prompt_key(prompt: dict) -> dict:
    """The prompt settings a stage key hashes, of a ``prompt`` node (:meth:`PromptSettings.key`)."""
    from mice_exp.llm.settings import PromptSettings

    return PromptSettings.from_config(prompt).key()


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
    from mice_exp.llm.settings import LLMSettings

    return load_llm(LLMSettings.from_config(llm_conf("tiny_random")), MODELS_CACHE)


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


def package_findings(check: Any, outside: str | None = None) -> dict[str, list[str]]:
    """What ``check`` (a module's source -> its findings) finds in each module of mice_exp/, but for the modules of
    the subpackage ``outside``, which may do what the others may not."""
    package = PACKAGE_ROOT / "mice_exp"
    return {str(p.relative_to(package)): hits for p in sorted(package.rglob("*.py"))
            if (outside is None or p.parent.relative_to(package).parts[:1] != (outside,))
            and (hits := check(p.read_text(encoding="utf-8")))}
