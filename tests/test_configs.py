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
    from mice_exp.llm import settings, toolcall

    assert config.SPLIT_NAMES == splits.SPLIT_NAMES
    assert config.DEMO_POOLS == data.DEMO_POOLS
    assert config.DEMO_MIXES == retrieval.DEMO_MIXES
    assert config.TOOL_MODES == settings.TOOL_MODES and config.DEMO_TOOLS == settings.DEMO_TOOLS
    assert set(config.CALL_FORMATS) == set(toolcall.FORMATS)


def listed_groups(text: str) -> dict[str, list[str]]:
    """``{"llm": ["gemma3_270m", "smollm2_135m*", ...]}`` from the groups part of ``mice-exp --help``."""
    groups: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        if not line.startswith("   "):  # a group's first line; its wrapped lines are indented further
            group, _, line = line.strip().partition("= ")
            groups[group] = ""
        groups[group] += " " + line.strip()
    return {group: [o.strip() for o in options.split("(")[0].split("|")] for group, options in groups.items()}


def test_help_lists_every_config_group_with_its_options_and_its_default():
    """``mice-exp --help`` reads conf/, so what it lists is what ``GROUP=OPTION`` accepts today."""
    from mice_exp.commands import config_groups

    groups = listed_groups(config_groups())
    folders = {p.parent.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml") if p.parent != CONF}
    assert set(groups) == {f"+{g}" if g in ("experiment", "scale") else g for g in folders}
    for group, options in groups.items():
        files = sorted(p.stem for p in (CONF / group.lstrip("+")).glob("*.yaml"))
        assert [o.rstrip("*") for o in options if o != "basic*"] == files
    assert "smollm2_135m*" in groups["llm"] and "mice_rf*" in groups["estimator"] and "ste*" in groups["dataset"]
    assert not any(o.endswith("*") for o in groups["+experiment"])  # no preset is on by default
    OmegaConf.to_container(compose_config(["+scale=small", "+experiment=table1"]), resolve=True)  # as listed


def test_a_new_config_file_is_listed_without_a_word_in_the_code(tmp_path):
    (tmp_path / "llm").mkdir()
    (tmp_path / "extra").mkdir()
    (tmp_path / "config.yaml").write_text("defaults:\n  - llm: a\n  - estimator@baselines.a: a\n  - _self_\n")
    for path in ("llm/a.yaml", "llm/b.yaml", "extra/x.yaml"):
        (tmp_path / path).write_text("{}\n")
    from mice_exp.commands import config_groups

    assert listed_groups(config_groups(tmp_path)) == {"+extra": ["x"], "llm": ["a*", "b"]}
