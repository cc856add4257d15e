"""The data set seam (issue 37): a data set is its module and its YAML, nothing else in the package asks which
data set it is, and a data set's tools that are no object schema are refused in one line (issue 42)."""

from __future__ import annotations

import ast
import json
import textwrap

import pytest

from conftest import tiny_run
from mice_exp.compose import as_plain, compose_config
from mice_exp.data import make_dataset
from mice_exp.data.jsonl import load_jsonl
from mice_exp.data.labels import is_correct
from mice_exp.errors import UserError
from mice_exp.gate.queries import parse_query
from mice_exp.paths import PACKAGE_ROOT, Paths
from tests.conftest import package_findings
from tests.recipes import follow_recipe


def test_a_new_data_set_is_a_module_and_a_yaml(tmp_path, monkeypatch):
    """The recipe of docs/extending.md: arithmetic queries whose label is the data set's own rule (the right tool,
    whatever the arguments), to show that the rule comes from the data set's class."""
    follow_recipe("A new data set", tmp_path, monkeypatch)
    overrides = ["dataset=toy", "prompt.k_demos=1"]
    result, records = tiny_run(tmp_path, *overrides)
    assert len(records) == 12 and {r["dataset"] for r in records} == {"toy"}
    assert {r["split"] for r in records if r["api"] == "add"} == {"train", "validation", "test"}
    for r in records:  # labelled by Toy.is_correct: the right tool, whatever the arguments
        assert r["label"] == int(r["pred_api"] == r["api"] and r["pred_args"] is not None)
    assert "objective" in result  # the estimation ran on it
    toy = make_dataset(as_plain(compose_config(overrides))["dataset"])
    (example, *_) = toy.select(Paths(tmp_path, tmp_path)).examples
    assert is_correct(example, example.gold, {"a": -1}) and not is_correct(example, "mul", {})  # Toy's rule
    with pytest.raises(UserError, match=r"^dataset\._target_='mice_exp\.data\.toy\.Toy': .*per_api"):
        tiny_run(tmp_path, *overrides, "~dataset.per_api")  # its settings are its constructor's


#: Data set names as ``conf/dataset`` spells them, and the ones issue 40 adds.
NAMES = {p.stem for p in (PACKAGE_ROOT / "conf" / "dataset").glob("*.yaml")} | {"when2call", "tooltalk",
                                                                                 "bfcl_multi_turn", "ste", "bfcl",
                                                                                 "jsonl"}


def dataset_name_comparisons(source: str) -> list[str]:
    """Comparisons in ``source`` against a data set's name or an example's ``dataset``, and collections of names
    (the tables an ``elif`` over names reads)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        named = any(isinstance(sub, ast.Constant) and sub.value in NAMES for n in operands for sub in ast.walk(n))
        by_dataset = any(isinstance(n, ast.Attribute) and n.attr == "dataset" for n in operands)
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
        listed = isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set)) and any(
            isinstance(n, ast.Constant) and n.value in NAMES for n in items)
        if named or by_dataset or listed:
            found.append(f"{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_nothing_outside_data_chooses_by_a_data_set_s_name():
    assert dataset_name_comparisons('if example.dataset == "bfcl": pass\nDATASETS = ("ste", "jsonl")') == [
        "1: example.dataset == 'bfcl'", "2: ('ste', 'jsonl')"]  # what the check finds
    assert package_findings(dataset_name_comparisons, outside="data") == {}


#: Issue 42: tools no prompt can show as a schema; the gate's API refuses the same ones.
BAD_TOOLS = {
    "required names a missing argument": ({"type": "object", "properties": {"city": {"type": "string"}},
                                           "required": ["day"]}, "'required' names 'day', which is not in 'properties'"),
    "properties is not an object": ({"type": "object", "properties": "oops"},
                                    "'properties' must map each argument name to a schema object"),
    "parameters of type array": ({"type": "array", "items": {"type": "string"}}, "is not a JSON schema of type 'object'"),
    "parameters a list": (["city", "day"], "is not a JSON schema of type 'object'"),
    "parameters a string": ("city, day", "is not a JSON schema of type 'object'"),
    "short form with values that are no types": ({"city": 5, "day": None},
                                                 "'properties' must map each argument name to a schema object"),
}


@pytest.mark.parametrize("case", BAD_TOOLS)
def test_a_tool_that_is_no_object_schema_is_one_line_naming_it(case, tmp_path):
    parameters, problem = BAD_TOOLS[case]
    tool = {"name": "weather", "description": "Forecast.", "parameters": parameters}
    line = {"id": 1, "api": "weather", "query": "Weather in Paris?", "tools": [tool],
            "gold": {"action": "weather", "action_input": {"city": "Paris"}}}
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(line) + "\n")
    expected = rf"^{path}:1: tool 'weather': .*{problem}.*; expected 'parameters' to be an object schema"
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")) as error:
        load_jsonl(path)
    assert "\n" not in str(error.value)
    with pytest.raises(UserError, match=r"^query #0: tool 'weather': "):  # a gate's batch query: that line's answer
        parse_query({"query": "Weather in Paris?", "tools": [tool]}, 0)


def test_the_gate_and_the_data_sets_check_tools_with_one_function():
    from mice_exp.data import schemas
    from mice_exp.gate import chat

    assert chat.object_schema_problem is schemas.object_schema_problem


def test_a_user_data_set_outside_the_package_loads_through_hydra_searchpath(tmp_path):
    """What the first test composes, without running: the YAML's keys reach the class, ``name`` is checked."""
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "mine.yaml").write_text(textwrap.dedent("""
        name: jsonl
        _target_: mice_exp.data.jsonl.Jsonl
        path: tests/fixtures/tools.jsonl
        split: {train: 1, validation: 1, test: 1}
        seed: 0
    """))
    cfg = as_plain(compose_config([f"hydra.searchpath=[file://{tmp_path}]", "dataset=mine"]))
    selection = make_dataset(cfg["dataset"]).select(Paths(root=PACKAGE_ROOT, cache=tmp_path))
    assert [e.api for e in selection.examples] == ["weather", "add_date", "add_date"]
