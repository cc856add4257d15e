"""Loaders, dataset configs and their user errors (mice_exp.data)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mice_exp.cache import file_sha256
from mice_exp.compose import as_plain, compose_config
from mice_exp.data import Example, make_dataset
from mice_exp.data.bfcl import CALL_CATEGORIES, load_bfcl
from mice_exp.data.jsonl import load_jsonl
from mice_exp.data.labels import argument_labels, is_correct
from mice_exp.data.ste import SHARED_RELATIVE_PATH, load_ste, resolve_ste_path
from mice_exp.errors import UserError
from mice_exp.paths import Paths

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY_STE = FIXTURES / "ste_tiny.json"
REAL_STE = ROOT / SHARED_RELATIVE_PATH
STE_SHA = "f774d7a21d99e949c4fc48384ec1308888d73b29c102968cbc94c52a7b32857f"

needs_real_ste = pytest.mark.skipif(not REAL_STE.is_file(), reason=f"shared STE data not at {REAL_STE}")


def dataset_cfg(name: str, **overrides: object) -> dict:
    """A conf/dataset/<name>.yaml as a plain dict, with overrides."""
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "dataset" / f"{name}.yaml"))
    cfg.update(overrides)
    return cfg


def load_dataset(cfg: dict, root: Path, cache: Path) -> list[Example]:
    """The examples the data set a ``conf/dataset`` node names selects."""
    return make_dataset(cfg).select(Paths(root=root, cache=cache)).examples


def parse_demo(demo: str) -> tuple[str, dict]:
    """The (api, args) a demonstration shows."""
    action, _, action_input = demo.partition("\nAction Input: ")
    return action.removeprefix("Action: "), json.loads(action_input)


# --- STE -------------------------------------------------------------------------------


@needs_real_ste
def test_ste_real_file_has_750_examples_over_50_apis() -> None:
    examples = load_dataset(dataset_cfg("ste"), ROOT, ROOT / ".cache")
    assert len(examples) == 750
    assert Counter(e.api for e in examples) == {api: 15 for api in {e.api for e in examples}}
    assert len({e.api for e in examples}) == 50
    assert len({e.id for e in examples}) == 750
    first = examples[0]
    assert first.id == "ste/add_date/0" and first.dataset == "ste"
    assert first.tool_names == ("add_date",) and first.tools.startswith("API_name: add_date")
    assert first.gold == {"action": "add_date", "action_input": {"date": "2022-10-14", "days": 90}}
    assert first.demo == 'Action: add_date\nAction Input: {\n    "date": "2022-10-14",\n    "days": 90\n}'
    assert all(is_correct(e, *parse_demo(e.demo)) for e in examples)


def test_ste_path_resolution_prefers_the_given_path_then_shared(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shared = project / SHARED_RELATIVE_PATH
    shared.parent.mkdir(parents=True)
    shutil.copy(TINY_STE, shared)
    no_url = "file:///nonexistent"
    assert resolve_ste_path(None, project, tmp_path / "cache", no_url, STE_SHA) == shared
    assert resolve_ste_path(TINY_STE, project, tmp_path / "cache", no_url, STE_SHA) == TINY_STE
    with pytest.raises(UserError, match=r"dataset\.path='missing\.json'.*tool_test\.json"):
        resolve_ste_path("missing.json", project, tmp_path / "cache", no_url, STE_SHA)


def test_ste_download_checks_sha_and_caches(tmp_path: Path) -> None:
    project, cache = tmp_path / "project", tmp_path / "cache"
    project.mkdir()
    url = TINY_STE.as_uri()
    path = resolve_ste_path(None, project, cache, url, file_sha256(TINY_STE))
    assert path == cache / "ste" / "tool_test.json"
    assert path.read_bytes() == TINY_STE.read_bytes()
    # Cached: no second download (this URL would fail).
    assert resolve_ste_path(None, project, cache, "file:///nonexistent", "0" * 64) == path
    examples = load_ste(path)
    assert [e.id for e in examples][:3] == ["ste/add_date/0", "ste/add_date/1", "ste/Car database%%Makes/0"]


def test_ste_download_with_wrong_sha_is_a_user_error_and_keeps_nothing(tmp_path: Path) -> None:
    project, cache = tmp_path / "project", tmp_path / "cache"
    project.mkdir()
    with pytest.raises(UserError, match=r"sha256 .* expected 0{64} \(dataset\.sha256\)"):
        resolve_ste_path(None, project, cache, TINY_STE.as_uri(), "0" * 64)
    assert list((cache / "ste").iterdir()) == []
    with pytest.raises(UserError, match=r"could not download file:///nonexistent"):
        resolve_ste_path(None, project, cache, "file:///nonexistent", "0" * 64)


def test_ste_malformed_files_name_the_file_and_example(tmp_path: Path) -> None:
    bad = tmp_path / "tool_test.json"
    bad.write_text('{"add_date": [{"query": "q", "action": "add_date"}]}')
    with pytest.raises(UserError, match=r"tool_test\.json: example 0 of API 'add_date' is malformed"):
        load_ste(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(UserError, match=r"tool_test\.json: expected a JSON object"):
        load_ste(bad)
    bad.write_text("{not json")
    with pytest.raises(UserError, match=r"tool_test\.json: cannot read STE data"):
        load_ste(bad)


# --- BFCL ------------------------------------------------------------------------------


def test_bfcl_loads_its_four_categories_and_accepts_its_own_gold() -> None:
    examples = load_bfcl(CALL_CATEGORIES)
    # 4 entries with unsatisfiable gold are left out (live_simple 106/112, live_multiple 862/964).
    assert Counter(e.api for e in examples) == {
        "simple_python": 400,
        "multiple": 200,
        "live_simple": 256,
        "live_multiple": 1051,
    }
    assert len({e.id for e in examples}) == len(examples)
    assert "bfcl/live_simple/106" not in {e.id for e in examples}
    for example in examples:
        api, args = parse_demo(example.demo)
        assert api == example.gold["name"] and api in example.tool_names
        assert is_correct(example, api, args), example.id
        assert all(argument_labels(example, args).values()), example.id  # so is each of its arguments
    first = examples[0]
    assert first.id == "bfcl/simple_python/0"
    assert first.query == "Find the area of a triangle with a base of 10 units and height of 5 units."
    assert json.loads(first.tools)[0]["name"] == "calculate_triangle_area"
    # "unit" accepts "" (may be omitted) and is not required: the demo leaves it out.
    assert parse_demo(first.demo) == ("calculate_triangle_area", {"base": 10, "height": 5})


def test_bfcl_query_keeps_the_system_message() -> None:
    examples = {e.id: e for e in load_bfcl(["live_multiple"])}
    query = examples["bfcl/live_multiple/1"].query
    assert query.startswith("You are an agent that is used for ordering food on your customers behalf")
    assert query.endswith("functions\n\nNO SUGAR in my coffee loll. Can you change my drink with drink id '1234' "
                          "order to have no sweetness, and also make sure it's served hot?")


def test_bfcl_unknown_category_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"unknown category 'parallel'.*simple_python"):
        load_bfcl(["simple_python", "parallel"])
    with pytest.raises(UserError, match=r"dataset\.categories"):
        load_bfcl("simple_python")


# --- jsonl -----------------------------------------------------------------------------


def test_jsonl_round_trip() -> None:
    examples = load_jsonl(FIXTURES / "tools.jsonl")
    assert [e.id for e in examples] == ["jsonl/weather/1", "jsonl/add_date/b", "jsonl/add_date/c"]
    weather, ste_style, named = examples
    assert weather.tool_names == ("weather", "add_date")
    assert json.loads(weather.tools)[0]["name"] == "weather"
    assert weather.demo == 'Action: weather\nAction Input: {"city": "Paris", "day": "tomorrow"}'
    assert ste_style.tool_names == ("add_date",)
    assert ste_style.gold == {"action": "add_date", "action_input": {"date": "2024-01-30", "days": 3}}
    assert ste_style.demo.endswith('{"date": "2024-01-30", "days": 3}')
    assert named.tools == "add_date(date, days): add days to a date" and named.tool_names == ("add_date",)
    for example in examples:
        assert is_correct(example, *parse_demo(example.demo))
    assert not is_correct(named, "add_date", {"date": "2023-12-25", "days": "10"})


def test_jsonl_malformed_line_names_file_and_line() -> None:
    with pytest.raises(UserError, match=r"malformed\.jsonl:2: not valid JSON"):
        load_jsonl(FIXTURES / "malformed.jsonl")


def jsonl_record(**changes: object) -> dict:
    """A valid jsonl record with some fields changed (None removes a field)."""
    base = {"id": 1, "api": "a", "query": "q", "tools": [{"name": "a"}], "gold": {"action": "a", "action_input": {}}}
    return {key: value for key, value in {**base, **changes}.items() if value is not None}


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (jsonl_record(gold=None), r"missing key\(s\) \['gold'\]"),
        (jsonl_record(tools="free text"), "tool_names"),
        (jsonl_record(tools=[{"title": "a"}]), "'name'"),
        (jsonl_record(tools=[{"name": "b"}]), "gold action 'a' is not among"),
        (jsonl_record(gold={"action": "a", "action_input": "{x"}), "not valid JSON"),
        (jsonl_record(gold={"action": "a", "action_input": [1]}), "must be a JSON object"),
        (jsonl_record(id=True), "'id' must be a string or an integer"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_jsonl_bad_records(tmp_path: Path, record: object, message: str) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(UserError, match=rf"data\.jsonl:1: .*{message}"):
        load_jsonl(path)


def test_jsonl_duplicate_ids(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    line = json.dumps(jsonl_record(id=7))
    path.write_text(f"{line}\n{line}\n")
    with pytest.raises(UserError, match=r"data\.jsonl:2: duplicate id '7'"):
        load_jsonl(path)


# --- load_dataset ----------------------------------------------------------------------


def test_load_dataset_dispatches_and_selects_apis(tmp_path: Path) -> None:
    jsonl = load_dataset(dataset_cfg("jsonl", path="tests/fixtures/tools.jsonl"), ROOT, tmp_path)
    assert [e.api for e in jsonl] == ["weather", "add_date", "add_date"]
    only = load_dataset(dataset_cfg("jsonl", path=str(FIXTURES / "tools.jsonl"), apis=["weather"]), ROOT, tmp_path)
    assert [e.id for e in only] == ["jsonl/weather/1"]
    bfcl = load_dataset(dataset_cfg("bfcl", categories=["simple_python", "multiple"], max_apis=1), ROOT, tmp_path)
    assert {e.api for e in bfcl} == {"multiple"}
    ste = load_dataset(dataset_cfg("ste", path=str(TINY_STE), max_apis=2), ROOT, tmp_path)
    assert sorted({e.api for e in ste}) == ["BART%%Advisory information", "Car database%%Makes"]


def test_a_first_look_at_each_bfcl_category_keeps_its_first_calls(tmp_path: Path) -> None:
    cfg = dataset_cfg("bfcl", categories=["simple_python", "multiple"])
    first = load_dataset(cfg | {"max_per_api": 5}, ROOT, tmp_path)
    every = load_dataset(cfg, ROOT, tmp_path)
    for category in ("simple_python", "multiple"):
        assert [e.id for e in first if e.api == category] == [e.id for e in every if e.api == category][:5]


def test_load_dataset_config_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^dataset=jsonl needs dataset\.path=FILE\.jsonl"):
        as_plain(compose_config(["dataset=jsonl"]))
    with pytest.raises(UserError, match=r"^dataset has no _target_; .*dataset=bfcl\|bfcl_multi_turn\|bfcl_relevance\|"):
        load_dataset({"name": "csv"}, ROOT, tmp_path)
    with pytest.raises(UserError, match=r"^dataset\._target_='mice_exp\.data\.ste\.Ste': .*'url'"):
        load_dataset({"name": "ste", "_target_": "mice_exp.data.ste.Ste", "path": None, "split": {}}, tmp_path, tmp_path)
    with pytest.raises(UserError, match=r"^dataset\.name='bfcl', but dataset\._target_=mice_exp\.data\.ste\.Ste is "
                                        r"the 'ste' dataset"):
        load_dataset(dataset_cfg("ste") | {"name": "bfcl"}, ROOT, tmp_path)
    with pytest.raises(UserError, match=r"dataset\.path: cannot read .*nope\.jsonl"):
        load_dataset(dataset_cfg("jsonl", path="nope.jsonl"), ROOT, tmp_path)
    with pytest.raises(UserError, match=r"dataset\.apis: unknown API 'wether'.*'weather'"):
        load_dataset(dataset_cfg("jsonl", path=str(FIXTURES / "tools.jsonl"), apis=["wether"]), ROOT, tmp_path)
