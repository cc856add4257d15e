"""A whole conversation as the gate's prompt (mice_exp.gate.chat + llm/prompt.py), rendered with SmolLM2's chat
template and tokenizer; every message shown, or the request refused in one line."""

from __future__ import annotations

import json
import re

import pytest

from mice_exp.compose import as_plain, compose_config
from mice_exp.gate.chat import InvalidRequest, chat_example
from mice_exp.llm.prompt import PromptBuilder
from mice_exp.llm.settings import PromptSettings

ADD_DATE = {"type": "function", "function": {"name": "add_date", "description": "Add days to a date.", "parameters": {
    "type": "object", "properties": {"date": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["date", "days"]}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "add_date", "arguments": json.dumps({"date": "2022-09-01", "days": 29})}}
AGENT_LOOP = [{"role": "system", "content": "Dates are ISO 8601. Answer tersely."},
              {"role": "user", "content": "What is 29 days after 2022-09-01?"},
              {"role": "assistant", "content": None, "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_1", "content": "2022-09-30"},
              {"role": "assistant", "content": "It is 2022-09-30."},
              {"role": "user", "content": "And 30 days after that date?"}]


def builder(tokenizer, prompt: str) -> PromptBuilder:
    return PromptBuilder.from_config(PromptSettings.from_config(as_plain(compose_config([f"prompt={prompt}"]))["prompt"]), tokenizer)


def rendered(tokenizer, prompt: str, messages: list[dict], tools: list[dict] | None = None) -> str:
    b = builder(tokenizer, prompt)
    example = chat_example(messages, tools or [ADD_DATE], 0, schemas=b.schemas)
    return tokenizer.decode(b.encode(example, []))


@pytest.mark.parametrize("prompt, call, result, answer", [
    ("ste", 'Action: add_date\nAction Input: {"date": "2022-09-01", "days": 29}', "Observation: 2022-09-30",
     "Final Answer: It is 2022-09-30."),
    ("json_tools", '<tool_call>\n{"name": "add_date", "arguments": {"date": "2022-09-01", "days": 29}}\n</tool_call>',
     "<tool_response>\n2022-09-30\n</tool_response>", "It is 2022-09-30."),
])
def test_the_prompt_holds_the_system_message_earlier_turns_and_tool_results(tokenizer, prompt, call, result, answer):
    text = rendered(tokenizer, prompt, AGENT_LOOP)
    system = text.index("Dates are ISO 8601. Answer tersely.")
    first = text.index("User Query: What is 29 days after 2022-09-01?")
    order = [first, text.index(call), text.index(result), text.index(answer),
             text.index("User Query: And 30 days after that date?")]
    assert system < first and order == sorted(order)  # the caller's system text in the system turn, turns in order
    assert text.count("<|im_start|>system") == 1 and text.rstrip().endswith("<|im_start|>assistant")
    # a tool result is a user turn of its own, so turns alternate under any template
    roles = re.findall(r"<\|im_start\|>(\w+)", text)
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]


def test_a_conversation_ending_with_a_tool_result_asks_for_the_models_next_reply(tokenizer):
    text = rendered(tokenizer, "ste", AGENT_LOOP[:4])
    assert text.rstrip().endswith("Observation: 2022-09-30<|im_end|>\n<|im_start|>assistant")
    alone = rendered(tokenizer, "ste", AGENT_LOOP[1:2])  # one user turn: the prompt the gate was fitted on
    assert alone.endswith("User Query: What is 29 days after 2022-09-01?<|im_end|>\n<|im_start|>assistant\n")
    assert "Dates are ISO 8601" not in alone


def test_parallel_calls_and_their_results_are_all_shown(tokenizer):
    second = {"id": "call_2", "type": "function", "function": {"name": "add_date", "arguments": {"date": "2023-01-01",
                                                                                                 "days": 1}}}
    messages = [AGENT_LOOP[1], {"role": "assistant", "content": "Two dates.", "tool_calls": [CALL, second]},
                {"role": "tool", "tool_call_id": "call_2", "content": "2023-01-02"},
                {"role": "tool", "tool_call_id": "call_1", "content": "2022-09-30"}]
    text = rendered(tokenizer, "ste", messages)
    assert "Two dates.\nAction: add_date\nAction Input: {\"date\": \"2022-09-01\", \"days\": 29}\nAction: add_date" in text
    assert "Observation: 2023-01-02\nObservation: 2022-09-30" in text


#: a tool with a parameter of each shape the SDKs emit: enum, optional (anyOf with null), nested object, array
BOOK = {"type": "function", "function": {"name": "book", "description": "Book a trip.", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo"]},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "traveller": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                      "required": ["name"]},
        "stops": {"type": "array", "items": {"type": "string"}}},
    "required": ["city", "traveller"]}}}


def test_schema_tools_of_every_shape_reach_a_json_tools_prompt_as_given(tokenizer):
    text = rendered(tokenizer, "json_tools", AGENT_LOOP[1:2], [BOOK])
    assert json.dumps(BOOK, ensure_ascii=False) in text
    with pytest.raises(InvalidRequest, match="which STE's text form cannot show"):
        rendered(tokenizer, "ste", AGENT_LOOP[1:2], [BOOK])


def test_a_parameter_that_may_be_null_reaches_an_ste_prompt_as_an_optional_one(tokenizer):
    """``days: int | None = None`` as the OpenAI Agents SDK's strict schema writes it (required, nullable)."""
    sdk = {"type": "function", "function": {"name": "get_weather", "description": "Forecast.", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["city", "days"], "properties": {
            "city": {"title": "City", "type": "string"},
            "days": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Days"}}}}}
    text = rendered(tokenizer, "ste", AGENT_LOOP[1:2], [sdk])
    assert '"required_parameters": [{"name": "city", "type": "STRING", "description": "", "default": ""}], ' \
           '"optional_parameters": [{"name": "days", "type": "INTEGER", "description": "", "default": ""}]' in text


@pytest.mark.parametrize("messages, param, message", [
    ([AGENT_LOOP[1], AGENT_LOOP[2], {"role": "tool", "content": "r"}], "messages[2].tool_call_id",
     "a tool message without a tool_call_id"),
    ([AGENT_LOOP[1], AGENT_LOOP[2], {"role": "tool", "tool_call_id": "call_9", "content": "r"}],
     "messages[2].tool_call_id", "'call_9' matches no unanswered call of the assistant turn before it (its calls: 'call_1')"),
    ([AGENT_LOOP[1], {"role": "tool", "tool_call_id": "call_1", "content": "r"}], "messages[1].tool_call_id",
     "(its calls: none)"),
    (AGENT_LOOP[1:3] + [AGENT_LOOP[5]], "messages[2]", "the call 'add_date' (id 'call_1') has no tool result"),
    ([AGENT_LOOP[1], {"role": "critic", "content": "r"}], "messages[1].role", "expected an object with a role in"),
    ([AGENT_LOOP[1], {"role": "function", "name": "f", "content": "r"}], "messages[1].role", "legacy function-call"),
    ([AGENT_LOOP[1], AGENT_LOOP[0], AGENT_LOOP[5]], "messages[1].role", "a system message after the conversation began"),
    (AGENT_LOOP[:3], "messages[2].role", "expected the conversation to end with a user message or with tool results"),
    ([AGENT_LOOP[0]], "messages", "holds no user message"),
    ([{"role": "user", "content": "bad \ud800 text"}], "messages[0].content", "lone UTF-16 surrogate ('\\ud800') at "
                                                                             "character 4"),
    ([AGENT_LOOP[1], {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add_date", "arguments": "{not json"}}]}],
     "messages[1].tool_calls[0].function.arguments", "is not valid JSON"),
    ([AGENT_LOOP[1], {"role": "assistant", "content": ""}], "messages[1].content", "neither text nor tool calls"),
], ids=["no-tool-call-id", "unknown-id", "no-call-to-answer", "unanswered-call", "unknown-role", "function-role",
        "late-system", "ends-with-assistant", "no-user", "lone-surrogate", "bad-arguments", "empty-assistant"])
def test_a_message_the_prompt_cannot_show_is_refused_in_one_line(messages, param, message):
    with pytest.raises(InvalidRequest, match=re.escape(message)) as info:
        chat_example(messages, [ADD_DATE], 0, schemas=False)
    assert info.value.param == param and info.value.status == 400 and "\n" not in str(info.value)


@pytest.mark.parametrize("arguments, problem", [
    ({"city": "Oslo", "traveller": {"name": "Ann", "age": 34}, "stops": ["Bergen"], "note": None}, None),
    ({"city": "Rome", "traveller": {"name": "Ann"}}, "has city=\"Rome\": 'Rome' is not one of ['Paris', 'Oslo']"),
    ({"city": "Oslo", "traveller": {"age": 34}}, "lacks the required argument 'traveller.name'"),
    ({"city": "Oslo", "traveller": {"name": "Ann", "age": "34"}}, "has traveller.age=\"34\": '34' is not of type"),
    ({"city": "Oslo", "traveller": {"name": "Ann"}, "stops": ["Bergen", 3]}, "has stops[1]=3: 3 is not of type"),
    ({"city": "Oslo", "traveller": {"name": "Ann"}, "note": 5}, "has note=5: 5 is not valid under any of"),
])
def test_a_proposed_call_is_checked_against_its_tools_whole_schema(arguments, problem):
    """What a gate answers instead of executing: the first thing the tool's JSON schema does not admit, nested
    objects, array items and anyOf alternatives included."""
    from mice_exp.gate.chat import call_problem, check_tools

    said = call_problem("book", json.dumps(arguments), check_tools([BOOK]))
    assert said == problem if problem is None else problem in said


def test_a_tool_whose_schema_is_no_json_schema_is_refused_naming_where():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "strng"}}}}}
    with pytest.raises(InvalidRequest, match=re.escape("""Invalid schema for function 'f': parameters["properties"]["x"]["type"]""")):
        chat_example(AGENT_LOOP[1:2], [bad], 0, schemas=True)


@pytest.mark.slow  # SmolLM2 and the BERTScore encoder: ~25 s quiet, 90 s beside a test run (2-core AVX2)
def test_the_published_json_tools_gate_judges_a_call_to_a_tool_of_every_shape():
    """The schema-tool gate built from the published `prompt=json_tools` records (experiments/json_tools: no LLM
    run behind it) takes BOOK as given and scores SmolLM2's reading of a proposed call to it; a call the schema
    does not admit is scored too, never executed."""
    from mice_exp.gate import Gate
    from mice_exp.paths import PACKAGE_ROOT

    gate = Gate.load(PACKAGE_ROOT / "experiments" / "json_tools" / "gate-smollm2_135m")
    messages = [{"role": "user", "content": "Book me a trip to Oslo for Ann, 34, stopping in Bergen."}]
    arguments = {"city": "Oslo", "traveller": {"name": "Ann", "age": 34}, "stops": ["Bergen"], "note": None}
    good = gate.score(messages, [BOOK], {"name": "book", "arguments": arguments}, tau=0.0)
    assert good.execute and good.call.name == "book" and good.call.arguments == arguments
    assert 0.0 < good.probability < 1.0 and {"city", "traveller", "stops"} <= set(good.arguments)
    bad = gate.score(messages, [BOOK], {"name": "book", "arguments": arguments | {"city": "Rome"}}, tau=0.0)
    assert not bad.execute and "has city=\"Rome\": 'Rome' is not one of" in bad.reason
    assert 0.0 <= bad.probability <= 1.0
