"""The ``llm``, ``prompt`` and ``retrieval`` groups as frozen settings (:mod:`mice_exp.llm.settings`): one field per
key the YAML files define, the mapping given back unchanged for every key and file that records it (published
records files keep their stage key), derived values computed once, nothing changed after the build."""

from __future__ import annotations

import dataclasses

import pytest

from mice_exp.cache import stable_hash
from mice_exp.compose import as_plain, compose_config
from mice_exp.config import check_group_keys, group_keys, source_blocks
from mice_exp.errors import UserError
from mice_exp.llm.records import read_records_header
from mice_exp.llm.settings import LLMSettings, PromptSettings, RetrievalSettings
from mice_exp.llm.sources import SOURCES
from mice_exp.paths import PACKAGE_ROOT, Paths
from tests.conftest import stage_of

SETTINGS = (LLMSettings, PromptSettings, RetrievalSettings)
RECORDS = PACKAGE_ROOT / "experiments" / "records"


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda cls: cls.group)
def test_the_fields_are_the_keys_the_yaml_files_define(cls):
    assert {f.name for f in dataclasses.fields(cls)} - {"given"} == group_keys(cls.group)


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda cls: cls.group)
def test_the_settings_give_back_the_config_and_change_nothing_after_the_build(cls):
    node = as_plain(compose_config(["prompt=json_tools"]))[cls.group]
    settings = cls.from_config(node)
    assert settings.as_dict() == node and list(settings.as_dict()) == list(node)  # the same keys in the same order
    settings.as_dict().clear()  # a copy: what a caller does to it does not reach the settings
    assert settings.as_dict() == node
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.device = "cuda"  # type: ignore[misc]


def test_an_unknown_or_missing_key_is_one_line():
    llm = as_plain(compose_config([]))["llm"]
    with pytest.raises(UserError, match=r"^llm\.batch_sise=4 is not a setting: nothing reads it; expected one of llm\."):
        LLMSettings.from_config(llm | {"batch_sise": 4})
    with pytest.raises(UserError, match=r"^llm\.context_window is missing"):
        LLMSettings.from_config({k: v for k, v in llm.items() if k != "context_window"})


def test_the_derived_values():
    cfg = as_plain(compose_config(["prompt=json_tools", "llm.context_window=2048", "llm.max_new_tokens=48"]))
    llm, prompt = LLMSettings.from_config(cfg["llm"]), PromptSettings.from_config(cfg["prompt"])
    assert llm.prompt_budget == 2000 and llm.title == cfg["llm"]["display"]
    assert prompt.schemas and prompt.fmt.name == "tool_call" and not PromptSettings.from_config(
        as_plain(compose_config([]))["prompt"]).schemas
    auto = llm.overridden(dtype="auto", device="cpu")
    assert auto.pinned().dtype == "float32" and auto.pinned().as_dict() == {**auto.as_dict(), "dtype": "float32"}
    assert auto.dtype == "auto"  # pinning builds new settings


@pytest.mark.parametrize("name, overrides", [("ste-smollm2_135m", ["llm=smollm2_135m"]),
                                             ("ste-gemma3_270m-json_tools", ["llm=gemma3_270m", "prompt=json_tools"])])
def test_a_published_records_file_keeps_its_stage_key(name, overrides, tmp_path):
    """The stage built on settings hashes what the stage that wrote the file hashed: its key and cache folder are
    the header's."""
    header = read_records_header(RECORDS / f"{name}.jsonl.gz")
    stage = stage_of(as_plain(compose_config(overrides)), Paths(root=PACKAGE_ROOT, cache=tmp_path))
    assert stage.key("cpu") == header["stage_key"]
    assert stage.folder()[0].name == header["stage_cache"] == f"{stage.llm.name}-{stable_hash(header['stage_key'])}"


def test_the_config_check_knows_every_source_s_block_from_the_sources_table():
    assert source_blocks() == [f"sources.{b}" for b in dict.fromkeys(s.block for s in SOURCES.values())]
    cfg = as_plain(compose_config([]))
    for block in dict.fromkeys(s.block for s in SOURCES.values()):
        typo = {**cfg, "sources": {**cfg["sources"], block: {**cfg["sources"][block], "sampels": 5}}}
        with pytest.raises(UserError, match=rf"^sources\.{block}\.sampels=5 is not a setting: nothing reads it"):
            check_group_keys(typo)
