"""``prompt=json_tools``: tools as JSON function schemas, replies parsed as JSON / ``<tool_call>`` calls.

Schemas from a real STE API and a real BFCL function; each reply format on hand-written replies; the
generic system-turn rendering and a chat template's own (``tools=``); a tiny_random LLM stage and a gate
under ``prompt=json_tools``; and ``prompt=ste`` keeping its keys.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from transformers import AutoTokenizer

from mice_exp.compose import as_plain, compose_config
from mice_exp.config import check_values
from mice_exp.data import select_examples
from mice_exp.data.bfcl import NO_CALL_DEMO, load_bfcl
from mice_exp.data.records import Example, format_demo
from mice_exp.data.ste import SHARED_RELATIVE_PATH, load_ste
from mice_exp.errors import UserError
from mice_exp.llm.generation import truncate
from mice_exp.llm.prompt import PromptBuilder, renders_tools
from mice_exp.llm.settings import PromptSettings
from mice_exp.llm.records import read_records_file, read_stage
from mice_exp.llm.toolcall import FORMATS, REACT, call_format, content_mask
from mice_exp.paths import PACKAGE_ROOT, Paths
from mice_exp.pipeline import Pipeline
from tests.conftest import prompt_key, stage_of

REAL_STE = PACKAGE_ROOT / SHARED_RELATIVE_PATH
STE_TINY = PACKAGE_ROOT / "tests" / "fixtures" / "ste_tiny.json"
needs_real_ste = pytest.mark.skipif(not REAL_STE.is_file(), reason=f"shared STE data not at {REAL_STE}")
JSON, TAGGED = FORMATS["json"], FORMATS["tool_call"]

# A chat template that renders tools= (Qwen 2.5's tool section, shortened): what prompt=json_tools hands them to.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n"
    "{% endif %}# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}{% if message['role'] != 'system' %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_cfg(*extra: str) -> dict:
    return as_plain(compose_config(["llm=tiny_random", f"dataset.path={STE_TINY}", "llm.batch_size=3",
                                    "llm.max_new_tokens=6", "prompt.k_demos=2", *extra]))


def tool(name: str, **properties: str) -> Example:
    """An Example offering one BFCL-style function whose gold call is ``name(**properties)``."""
    function = {"name": name, "description": f"{name} things.",
                "parameters": {"type": "dict", "properties": {k: {"type": "string"} for k in properties}}}
    return Example(id=f"bfcl/x/{name}", dataset="bfcl", api="x", query=f"please {name}", tools=json.dumps([function]),
                   tool_names=(name,), gold={}, demo=format_demo(name, properties))


# --- schemas ----------------------------------------------------------------------------


@needs_real_ste
def test_an_ste_api_becomes_a_function_schema():
    examples = {e.api: e for e in load_ste(REAL_STE)}
    assert examples["add_date"].schemas == [{"type": "function", "function": {
        "name": "add_date", "description": "Add days to a date. Date should be pass as 'yyyy-mm-dd'..",
        "parameters": {"type": "object", "properties": {"date": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["date", "days"]}}}]
    (stadia,) = examples["Stadia Maps Time Zone API%%TZ Lookup by Location"].schemas  # RapidAPI's form
    params = stadia["function"]["parameters"]
    assert params["required"] == ["lat", "lng"] and list(params["properties"]) == ["lat", "lng", "timestamp"]
    assert params["properties"]["lat"] == {"type": "number", "description": "The latitude component of any point "
                                           "on land.", "default": 37.4666405}  # NUMBER, its default as a number
    assert stadia["function"]["description"].startswith("The Stadia TZ Lookup API provides time zone information")
    assert "(Stadia Maps Time Zone API: " in stadia["function"]["description"]  # the parent tool, as STE shows it
    (places,) = examples["Places%%Geographic coordinates by placename"].schemas
    assert places["function"]["parameters"]["properties"]["lang"]["type"] == "string"  # ENUM lists no values
    assert examples["get_today_date"].schemas[0]["function"]["parameters"] == {"type": "object", "properties": {},
                                                                             "required": []}
    assert all([s["function"]["name"] for s in e.schemas] == list(e.tool_names) for e in load_ste(REAL_STE))


@needs_real_ste
def test_every_ste_tool_comes_back_from_its_schema_in_stes_text_form():
    from mice_exp.data.schemas import ste_text, tool_schemas

    examples = {e.api: e for e in load_ste(REAL_STE)}
    for api, example in examples.items():
        (schema,) = example.schemas
        assert tool_schemas(ste_text(schema), api) == [schema], api
    handwritten = [e for e in examples.values() if not e.tools.split("Description: ", 1)[1].startswith("{")]
    assert len(handwritten) == 10 and all(ste_text(e.schemas[0]) == e.tools for e in handwritten)  # word for word


def test_a_bfcl_function_gets_json_schema_types():
    examples = {e.id: e for e in load_bfcl(["simple_python"])}
    (distance,) = examples["bfcl/simple_python/83"].schemas
    assert distance == {"type": "function", "function": {
        "name": "calculate_distance", "description": "Calculate the distance between two GPS coordinates.",
        "parameters": {"type": "object", "properties": {
            "coord1": {"type": "array", "description": "The first coordinate as (latitude, longitude).",
                       "items": {"type": "number"}},
            "coord2": {"type": "array", "description": "The second coordinate as (latitude, longitude).",
                       "items": {"type": "number"}},
            "unit": {"type": "string", "description": "The unit of distance. Options: 'miles', 'kilometers'."}},
            "required": ["coord1", "coord2", "unit"]}}}
    (forest,) = examples["bfcl/simple_python/109"].schemas
    assert forest["function"]["name"] == "random_forest.train"  # as BFCL's gold names it
    assert forest["function"]["parameters"]["properties"]["data"] == {"description": "The training data for the model."}


def test_every_bfcl_function_converts_to_json_schema_type_names():
    examples = load_bfcl(["simple_python", "multiple", "live_simple", "live_multiple", "live_irrelevance"])
    types = set()

    def walk(spec: dict) -> None:
        types.add(spec.get("type"))
        for child in spec.get("properties", {}).values():
            walk(child)
        if "items" in spec:
            walk(spec["items"])

    for example in examples:
        assert [s["function"]["name"] for s in example.schemas] == list(example.tool_names)
        for schema in example.schemas:
            walk(schema["function"]["parameters"])
    assert types == {"object", "string", "integer", "number", "boolean", "array", None}  # None: BFCL's "any"


def test_a_jsonl_file_s_tools_become_schemas_or_one_line_before_the_llm_loads():
    cfg = as_plain(compose_config(["prompt=json_tools", "dataset=jsonl", "dataset.path=tests/fixtures/tools.jsonl"]))
    paths = Paths(root=PACKAGE_ROOT, cache=PACKAGE_ROOT / ".cache")
    examples = {e.id: e for e in select_examples(cfg["dataset"], paths).examples}
    weather, add_date = examples["jsonl/weather/1"].schemas  # a list of tools, parameters in the short form
    assert weather["function"]["parameters"] == {"type": "object", "properties": {"city": {"type": "string"},
                                                 "day": {"type": "string"}}, "required": []}
    assert add_date["function"] == {"name": "add_date", "description": "Add days to a date.",
                                    "parameters": {"type": "object", "properties": {}, "required": []}}
    assert examples["jsonl/add_date/b"].schemas[0]["function"]["name"] == "add_date"  # STE-style text
    with pytest.raises(UserError, match=r"^example jsonl/add_date/c: its tools are free text without 'API_name:' "
                                        r"lines; prompt.tools=schemas expects"):
        Pipeline.from_config(cfg, paths).check_data()
    Pipeline.from_config(compose_config(["dataset=jsonl", "dataset.path=tests/fixtures/tools.jsonl"]), paths).check_data()


# --- reply formats ----------------------------------------------------------------------


def spans_text(fmt, text: str) -> tuple[str | None, str | None]:
    spans = fmt.spans(text)
    return tuple(None if s is None else text[s[0]:s[1]] for s in (spans.api, spans.args))


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))
def test_each_format_parses_what_it_writes_and_marks_the_name_and_arguments(fmt):
    text = fmt.write("get_weather", {"city": "Paris", "days": 3})
    call = fmt.parse(text)
    assert (call.api, call.args, call.parse_error) == ("get_weather", {"city": "Paris", "days": 3}, None)
    assert spans_text(fmt, text) == ("get_weather", '{"city": "Paris", "days": 3}')
    assert fmt.stop_offset(text + "\nmore text") == len(text) - (len("\n</tool_call>") if fmt is TAGGED else 0)
    assert call_format(fmt.name) is fmt


def test_a_json_reply_is_its_first_object_with_text_around_it():
    text = 'Sure, here it is: {"name": "f", "arguments": {"a": {"b": "}"}}} and {"name": "g", "arguments": {}}'
    call = JSON.parse(text)
    assert (call.api, call.args, call.parse_error) == ("f", {"a": {"b": "}"}}, None)
    assert text[:JSON.stop_offset(text)].endswith('"}"}}}')  # the first object closes, the second never starts
    assert spans_text(JSON, text) == ("f", '{"a": {"b": "}"}}')
    llama = JSON.parse('{"name": "f", "parameters": {"a": 1}}')  # Llama 3's key
    assert (llama.api, llama.args) == ("f", {"a": 1})


@pytest.mark.parametrize("text, error, spans", [
    ('{"name": "f", "arguments": {"a": 1,}}', "invalid call JSON: ", ("f", '{"a": 1,}')),
    ('{"name": "f", "arguments": {"a": 1}', "the call's JSON object does not close", ("f", '{"a": 1}')),
    ('{"arguments": {"a": 1}}', "the call's JSON object has no 'name' string", (None, '{"a": 1}')),
    ('{"name": "f", "arguments": "a=1"}', "the call's JSON object has no 'arguments' object", ("f", None)),
    ("I cannot help with that.", "no JSON object", (None, None)),
])
def test_a_json_reply_without_a_call_says_why(text, error, spans):
    call = JSON.parse(text)
    assert call.args is None and call.parse_error.startswith(error)
    assert spans_text(JSON, text) == spans  # malformed: what was written still counts for raw confidence


def test_a_tool_call_reply_is_its_first_block():
    two = ('Let me check.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
           '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    call = TAGGED.parse(two)
    assert (call.api, call.args, call.parse_error) == ("f", {"a": 1}, None)
    assert two[:TAGGED.stop_offset(two)].endswith('{"a": 1}}')
    assert TAGGED.parse('{"name": "f", "arguments": {}}').parse_error == "no '<tool_call>' block opening a JSON object"
    assert TAGGED.parse("<tool_call>\nf(a=1)\n</tool_call>").args is None
    broken = '<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>'
    assert TAGGED.parse(broken).parse_error.startswith("invalid call JSON")
    unclosed = '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>\nmore'
    assert unclosed[:TAGGED.stop_offset(unclosed)].endswith("</tool_call>")  # stops at the tag all the same
    assert TAGGED.stop_offset('<tool_call>\n{"name": "f", "arguments": {"a": ') is None  # still writing


def test_content_tokens_are_the_name_and_the_arguments_only():
    tokens = ["<tool_call>", "\n", '{"', "name", '":', ' "', "get", "_weather", '",', ' "', "arguments", '":', " {",
              '"city', '":', ' "Paris"', "}}", "\n", "</tool_call>"]
    text = "".join(tokens)
    offsets = [(sum(map(len, tokens[:i])), sum(map(len, tokens[:i + 1]))) for i in range(len(tokens))]
    mask = content_mask(offsets, TAGGED.spans(text))
    assert [t for t, m in zip(tokens, mask) if m] == ["get", "_weather", " {", '"city', '":', ' "Paris"', "}}"]


def test_truncation_keeps_the_tokens_up_to_the_complete_call(tokenizer):
    call = TAGGED.write("f", {"a": 1})
    ids = tokenizer(f"{call}\nand then some more words", add_special_tokens=False)["input_ids"]
    kept, offsets, text = truncate(tokenizer, ids, [tokenizer.eos_token_id], TAGGED)
    assert text.startswith(call.removesuffix("</tool_call>").rstrip()) and "more words" not in text
    assert TAGGED.parse(text).args == {"a": 1} and len(offsets) == len(kept) < len(ids)


def test_demonstrations_are_written_in_the_format():
    ste_demo = 'Action: add_date\nAction Input: {\n    "date": "2022-10-14",\n    "days": 90\n}'
    assert REACT.demonstration(ste_demo) == ste_demo  # verbatim, as every STE prompt shows it
    assert JSON.demonstration(ste_demo) == '{"name": "add_date", "arguments": {"date": "2022-10-14", "days": 90}}'
    assert TAGGED.demonstration(ste_demo) == (
        '<tool_call>\n{"name": "add_date", "arguments": {"date": "2022-10-14", "days": 90}}\n</tool_call>')
    assert TAGGED.demonstration(NO_CALL_DEMO) == NO_CALL_DEMO  # a reply without a call stays one


def test_an_unknown_format_or_tool_mode_is_one_line(tokenizer):
    with pytest.raises(UserError, match=r"^prompt\.format='xml'; expected one of react, json, tool_call$"):
        call_format("xml")
    with pytest.raises(UserError, match=r"^prompt\.tools='yaml'; expected one of text, schemas$"):
        PromptSettings.from_config(tiny_cfg("prompt=json_tools")["prompt"] | {"tools": "yaml"})
    for override, message in (("prompt.format=xml", r"prompt\.format='xml'; expected one of react, json, tool_call"),
                              ("prompt.tools=yaml", r"prompt\.tools='yaml'; expected one of text, schemas")):
        with pytest.raises(UserError, match=message):
            check_values(tiny_cfg(override))


# --- rendering --------------------------------------------------------------------------


def test_the_system_turn_shows_the_schemas_where_the_template_ignores_tools(tokenizer):
    assert not renders_tools(tokenizer)  # SmolLM2's template
    builder = PromptBuilder.from_config(PromptSettings.from_config(tiny_cfg("prompt=json_tools")["prompt"]), tokenizer)
    assert builder.chat and not builder.native and builder.fmt is TAGGED
    query, demos = tool("forecast", city="Oslo"), [tool("convert", unit="km"), tool("forecast", city="Rome")]
    messages = builder.messages(query, demos)
    system = messages[0]["content"]
    lines = [json.dumps(s, ensure_ascii=False) for s in (query.schemas + demos[0].schemas)]
    assert f"<tools>\n{lines[0]}\n{lines[1]}\n</tools>" in system  # each function once, the query's first
    assert '<tool_call>\n{"name": "<function name>", "arguments": {"<argument name>": "<value>"}}\n</tool_call>' in system
    assert "Action Input" not in system
    # demonstrations least similar first, each reply the gold call in the format
    assert [m["content"] for m in messages[1:]] == [
        "User Query: please forecast", '<tool_call>\n{"name": "forecast", "arguments": {"city": "Rome"}}\n</tool_call>',
        "User Query: please convert", '<tool_call>\n{"name": "convert", "arguments": {"unit": "km"}}\n</tool_call>',
        "User Query: please forecast"]
    text = tokenizer.decode(builder.build(query, demos, 8000).ids)
    assert text.count(lines[0]) == 1 and text.endswith("<|im_start|>assistant\n")
    plain = PromptBuilder.from_config(PromptSettings.from_config(tiny_cfg("prompt=json_tools", "prompt.chat_template=false")["prompt"]), tokenizer)
    assert lines[0] in plain.text(query, demos) and '{"unit": "km"}}\n</tool_call>\n\nUser Query' in plain.text(query, demos)


def test_a_template_that_renders_tools_gets_them_as_tools(tokenizer):
    own = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    own.chat_template = TOOLS_TEMPLATE
    assert renders_tools(own)
    builder = PromptBuilder.from_config(PromptSettings.from_config(tiny_cfg("prompt=json_tools")["prompt"]), own)
    query, demos = tool("forecast", city="Oslo"), [tool("convert", unit="km")]
    assert builder.native and builder.messages(query, demos)[0]["content"] == builder.system  # no tools section of ours
    text = own.decode(builder.build(query, demos, 8000).ids)
    for schema in query.schemas + demos[0].schemas:
        assert text.count(json.dumps(schema)) == 1  # the template's own tojson, once
    assert "<tools>" in text and "# Tools\n<tools>" in text and "<function name>" not in text


def test_per_demo_tools_offer_the_query_its_own_tools_alone(tokenizer):
    """prompt.demo_tools=per_demo: the instructions list the query's tools only, each turn its own; an
    irrelevance-style demonstration (no call) shows the tools it turned down."""
    query = tool("forecast", city="Oslo")
    declined = dataclasses.replace(tool("convert", unit="km"), demo=NO_CALL_DEMO)
    for prompt in ("json_tools", "ste"):
        cfg = tiny_cfg(f"prompt={prompt}", "prompt.demo_tools=per_demo")
        builder = PromptBuilder.from_config(PromptSettings.from_config(cfg["prompt"]), tokenizer)
        messages = builder.messages(query, [declined])
        convert = json.dumps(declined.schemas[0]) if prompt == "json_tools" else declined.tools
        assert "forecast" in messages[0]["content"] and "convert" not in messages[0]["content"]
        assert messages[1]["content"] == f"Tools for this query:\n{convert}\n\nUser Query: please convert"
        forecast = json.dumps(query.schemas[0]) if prompt == "json_tools" else query.tools
        assert messages[2]["content"] == NO_CALL_DEMO
        assert messages[3]["content"] == f"Tools for this query:\n{forecast}\n\nUser Query: please forecast"
        assert "convert" not in builder.head(query, [declined]) and builder.tools(query, [declined]) == query.schemas
    pooled = PromptBuilder.from_config(PromptSettings.from_config(tiny_cfg("prompt=json_tools")["prompt"]), tokenizer)
    assert "convert" in pooled.messages(query, [declined])[0]["content"]  # the default lists both
    with pytest.raises(UserError, match=r"prompt\.demo_tools='mixed'; expected one of pooled, per_demo"):
        check_values(tiny_cfg("prompt.demo_tools=mixed"))
    per_demo, pooled_key = (prompt_key(tiny_cfg(*o)["prompt"]) for o in (["prompt.demo_tools=per_demo"], []))
    assert per_demo["demo_tools"] == "per_demo" and "demo_tools" not in pooled_key  # every older key kept
    assert "demo_mix" not in pooled_key and prompt_key(tiny_cfg("prompt.demo_mix=balanced")["prompt"]) != pooled_key
    with pytest.raises(UserError, match=r"prompt\.demo_mix='half'; expected one of similar, balanced"):
        check_values(tiny_cfg("prompt.demo_mix=half"))


# --- the LLM stage, the gate, records files ---------------------------------------------


@pytest.fixture(scope="module")
def stages(tmp_path_factory, tiny_llm):
    tmp = tmp_path_factory.mktemp("json_tools")
    paths = Paths(root=PACKAGE_ROOT, cache=tmp)
    return {name: stage_of(tiny_cfg(f"prompt={name}"), paths, tiny_llm).run() for name in ("ste", "json_tools")}, paths


def test_a_json_tools_stage_writes_records_of_the_same_schema(stages, tiny_llm):
    (folders, paths) = stages
    ste, tools = (read_stage(folders[name]) for name in ("ste", "json_tools"))
    assert folders["ste"] != folders["json_tools"] and len(tools.records) == len(ste.records) == 6
    by_id = {r["id"]: r for r in ste.records}
    for b in tools.records:
        a = by_id[b["id"]]
        assert a.keys() == b.keys() and all(type(a[k]) is type(b[k]) for k in a if None not in (a[k], b[k]))
        assert b["prompt_tokens"] > a["prompt_tokens"] // 2 and a["prompt_hash"] != b["prompt_hash"]
        call = TAGGED.parse(b["text"])
        assert (b["pred_api"], b["pred_args"], b["parse_error"]) == (call.api, call.args, call.parse_error)
        assert b["content_mask"] == content_mask(b["offsets"], TAGGED.spans(b["text"]))
        assert b["label"] == 0 and b["parse_error"]  # tiny_random writes random tokens: no call
    assert tools.arrays("mean_pool").shape == ste.arrays("mean_pool").shape
    builder = PromptBuilder.from_config(PromptSettings.from_config(tiny_cfg("prompt=json_tools")["prompt"]),
                                        tiny_llm.tokenizer)
    prompt = tiny_llm.tokenizer.decode(builder.encode(select_examples(tiny_cfg()["dataset"], paths).examples[0], []))
    assert "<tools>\n" in prompt and "Action Input" not in prompt


def test_ste_keeps_its_keys_and_json_tools_gets_its_own(stages):
    (_, paths) = stages
    ste, tools = tiny_cfg("prompt=ste"), tiny_cfg("prompt=json_tools")
    assert (ste["prompt"]["tools"], ste["prompt"]["format"]) == ("text", "react")
    before = {k: v for k, v in ste["prompt"].items() if k not in ("tools", "format")}  # the prompt before the formats
    assert prompt_key(ste["prompt"]) == prompt_key(before) and not {"tools", "format"} & set(prompt_key(ste["prompt"]))
    key = stage_of(tools, paths).key("cpu")
    assert (key["prompt"]["tools"], key["prompt"]["format"]) == ("schemas", "tool_call")
    assert stage_of(ste, paths).key("cpu")["prompt"] == prompt_key(before)


def test_a_records_file_of_another_format_is_refused_in_one_line():
    path = PACKAGE_ROOT / "experiments" / "records" / "ste-smollm2_135m.jsonl.gz"
    with pytest.raises(UserError, match=r"written with format='react'; this run has prompt.format='tool_call'"):
        read_records_file(path, "ste", expect={"llm": "smollm2_135m", "demo_pool": "train", "format": "tool_call"})


def test_a_gate_answers_in_its_saved_format(stages, tiny_llm, tmp_path):
    from mice_exp.estimators import MiceLogisticRegression
    from mice_exp.features import build_features
    from mice_exp.gate import Gate, read_queries, save_gate
    from mice_exp.pipeline import Pipeline

    folders, paths = stages
    cfg = tiny_cfg("prompt=json_tools", "features=cosine", "estimator=mice_lr")
    stage = read_stage(folders["json_tools"])
    fs = build_features(cfg["features"], stage, paths.features)
    estimator = MiceLogisticRegression(C=1e6).fit(fs.X, np.array([1, 1, 0, 0, 1, 1]))
    pool = select_examples(cfg["dataset"], paths).examples
    folder = save_gate(tmp_path / "gate", Pipeline.from_config(cfg, paths), estimator, fs.view, pool,
                       llm_stage=stage.info)
    gate = Gate.load(folder, llm=tiny_llm)
    assert gate.builder().fmt is TAGGED and gate.builder().schemas
    items, places = read_queries(PACKAGE_ROOT / "tests" / "fixtures" / "gate_queries.jsonl")
    answers = {a["id"]: a for a in gate.decide(items, places)}
    assert answers["tool-list"]["error"] is None and answers["ste-text"]["error"] is None  # both become schemas
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    cut = [m.start() for m in re.finditer(r'"Paris"|, "days"|3}', text)] + [len(text)]
    offsets = [(0, cut[0])] + list(zip(cut, cut[1:]))  # ... | "Paris" | , "days": | 3}}\n</tool_call>
    record = {"pred_api": "get_weather", "pred_args": {"city": "Paris", "days": 3}, "text": text, "offsets": offsets,
              "token_probs": [1.0, 0.5, 1.0, 0.25], "raw_confidence": 0.125, "parse_error": None}
    assert gate._answer("q", record, 0.7)["arguments"] == {"city": 0.5, "days": 0.25}
