"""Parsing generated calls, stopping, and which tokens count towards raw confidence."""

import numpy as np

from mice_exp.llm.toolcall import content_mask, find_spans, json_object_end, parse_call, stop_offset


def tokens_to_offsets(tokens):
    offsets, pos = [], 0
    for token in tokens:
        offsets.append((pos, pos + len(token)))
        pos += len(token)
    return "".join(tokens), offsets


def test_well_formed_call_is_parsed():
    call = parse_call('Action: add_date\nAction Input: {"date": "2022-10-14", "days": 90}')
    assert call.api == "add_date"
    assert call.args == {"date": "2022-10-14", "days": 90}
    assert call.parse_error is None


def test_content_tokens_are_the_api_name_and_the_json_only():
    tokens = ["Action", ":", " add", "_date", "\n", "Action", " Input", ":", " {", '"days', '":', " 90", "}", "\n", "Obs"]
    text, offsets = tokens_to_offsets(tokens)
    mask = content_mask(offsets, find_spans(text))
    assert mask == [False, False, True, True, False, False, False, False, True, True, True, True, True, False, False]


def test_raw_confidence_multiplies_content_probabilities_only():
    tokens = ["Action", ":", " f", "\n", "Action Input", ":", " {}", "\n"]
    probs = np.array([0.5, 0.5, 0.9, 0.5, 0.5, 0.5, 0.8, 0.1])
    text, offsets = tokens_to_offsets(tokens)
    mask = np.array(content_mask(offsets, find_spans(text)))
    assert np.prod(probs[mask]) == 0.9 * 0.8


def test_braces_inside_strings_do_not_close_the_json():
    text = 'Action Input: {"q": "a } b {", "n": {"x": 1}} trailing'
    start = text.index("{")
    assert text[start:json_object_end(text, start)] == '{"q": "a } b {", "n": {"x": 1}}'


def test_escaped_quotes_inside_strings():
    text = '{"q": "say \\"}\\" now"}'
    assert json_object_end(text, 0) == len(text)


def test_stop_after_json_or_before_observation():
    assert stop_offset('Action: f\nAction Input: {"a": 1}\nObservation: x') == len('Action: f\nAction Input: {"a": 1}')
    assert stop_offset("Action: f\nObservation") == len("Action: f\n")
    assert stop_offset('Action: f\nAction Input: {"a": ') is None


def test_unparseable_output_is_flagged_not_raised():
    assert parse_call("I cannot help with that.").parse_error == "no 'Action:' line"
    assert parse_call("Action: f\nAction Input: {\"a\": 1,}").parse_error.startswith("invalid argument JSON")
    assert parse_call("Action: f\n").args is None


def test_unparseable_output_has_no_content_tokens():
    text, offsets = tokens_to_offsets(["I", " cannot"])
    assert content_mask(offsets, find_spans(text)) == [False, False]


def test_api_name_line_with_trailing_spaces():
    text = "Action:   get_weather   \nAction Input: {}"
    spans = find_spans(text)
    assert text[spans.api[0]:spans.api[1]] == "get_weather"
