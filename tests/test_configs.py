"""Every YAML under conf/ composes, and resolves with no missing interpolation."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from mice_exp.compose import compose_config
from mice_exp.paths import PACKAGE_ROOT

CONF = PACKAGE_ROOT / "conf"
GROUP_FILES = sorted(p for p in CONF.glob("*/*.yaml") if p.parent.name not in ("hydra", "experiment"))
OPTIONAL = {"dataset/jsonl.yaml"}  # needs dataset.path from the user
ADDED = {"scale"}  # groups outside the defaults list: added with +group=option


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_each_group_option_composes(path):
    plus = "+" if path.parent.name in ADDED else ""
    cfg = compose_config([f"{plus}{path.parent.name}={path.stem}"])
    rel = f"{path.parent.name}/{path.name}"
    if rel in OPTIONAL:
        assert OmegaConf.is_missing(cfg.dataset, "path")
    else:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


@pytest.mark.parametrize("path", sorted(CONF.glob("experiment/*.yaml")), ids=lambda p: p.stem)
def test_each_experiment_preset_composes(path):
    OmegaConf.to_container(compose_config([f"+experiment={path.stem}"]), resolve=True, throw_on_missing=True)


def test_default_config_is_smollm2_on_ste_with_mice_rf():
    cfg = compose_config([])
    assert (cfg.llm.name, cfg.dataset.name, cfg.estimator.key, cfg.features.name) == (
        "smollm2_135m", "ste", "mice_rf", "bertscore")
    assert OmegaConf.load(CONF / "config.yaml").hydra.job.chdir is False  # paths stay absolute


@pytest.mark.parametrize("path", sorted(CONF.glob("experiment/*.yaml")), ids=lambda p: p.stem)
def test_each_preset_runs_the_full_data_set_unless_scaled_down(path):
    full = compose_config([f"+experiment={path.stem}"])
    small = compose_config([f"+experiment={path.stem}", "+scale=small"])
    assert full.dataset.max_apis is None and small.dataset.max_apis == 3


def test_the_choices_a_config_is_checked_against_are_the_ones_the_code_accepts():
    """mice_exp.config keeps copies of these lists (importing the modules would load every data loader);
    a choice added to the code and not to its copy would be refused before the run."""
    from mice_exp import config, data
    from mice_exp.data import retrieval, splits
    from mice_exp.llm import prompt, toolcall

    assert config.SPLIT_NAMES == splits.SPLIT_NAMES
    assert config.DEMO_POOLS == data.DEMO_POOLS
    assert config.DEMO_MIXES == retrieval.DEMO_MIXES
    assert config.TOOL_MODES == prompt.TOOL_MODES and config.DEMO_TOOLS == prompt.DEMO_TOOLS
    assert set(config.CALL_FORMATS) == set(toolcall.FORMATS)
