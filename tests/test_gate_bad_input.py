"""The bad-input probe's rows on the gate's newest surfaces (issue 59): each is one clear line or the right
behaviour, on test_gate.py's tiny_random gate."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
import zipfile

import numpy as np
import pytest

from mice_exp.cache import file_sha256
from mice_exp.errors import UserError
from mice_exp.gate import Gate, InvalidRequest
from mice_exp.hosts import HttpScorer
from tests.stand_in_gate import StandInGate
from tests.test_gate import WEATHER, ask, fitted  # noqa: F401 - fitted: test_gate's saved tiny_random gate
from tests.test_hosts import gate, served  # noqa: F401 - the gate loaded from it, and mice-exp serve on it


def weather(arguments: str) -> dict:
    return {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": arguments}}


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_arguments_holding_a_lone_surrogate_are_refused_in_one_line_and_as_a_400(gate, served):
    call = weather('{"city": "Par\\ud800is"}')  # valid JSON; no tokenizer can encode the character it holds
    with pytest.raises(InvalidRequest, match=r"lone UTF-16 surrogate \('\\ud800'\); expected valid Unicode text"):
        gate.score(ask("Weather in Paris?"), [WEATHER], call)
    status, body = post(served.url + "/tool_calls/check", {"messages": ask("Weather in Paris?"), "tools": [WEATHER],
                                                            "tool_calls": [call]})
    assert status == 400 and "lone UTF-16 surrogate" in body["error"]["message"]


def test_tool_annotations_that_are_not_an_object_are_a_400(served):
    tool = {**WEATHER, "annotations": "yes"}
    status, body = post(served.url + "/tool_calls/check", {"messages": ask("Weather in Paris?"), "tools": [tool],
                                                            "tool_calls": [weather('{"city": "Paris"}')]})
    assert status == 400 and "the annotations of tool 'get_weather' are \"yes\"" in body["error"]["message"]


def test_an_empty_batch_is_an_empty_list(gate):
    assert gate.score_batch([]) == [] and gate.check_batch([]) == []


def test_arguments_nested_too_deeply_are_denied_not_a_recursion_error(gate):
    deep = '{"city": ' + "[" * 100_000 + "]" * 100_000 + "}"
    decision = gate.score(ask("Weather in Paris?"), [WEATHER], weather(deep))
    assert decision.probability is None and not decision.execute and "nest too deeply" in decision.reason


def test_a_call_that_is_not_a_function_call_is_refused_in_one_line(gate):
    with pytest.raises(InvalidRequest, match=r'call.type is "code_interpreter"; the gate judges function calls'):
        gate.score(ask("Weather in Paris?"), [WEATHER], {"type": "code_interpreter", "code": "print(1)"})


def copy_of(fitted, tmp_path):  # noqa: F811 - the fixture's value
    folder = tmp_path / "gate"
    shutil.copytree(fitted[0], folder)
    return folder


def test_a_gate_whose_skops_file_holds_an_object_array_is_one_line(fitted, tmp_path):  # noqa: F811
    folder = copy_of(fitted, tmp_path)
    spec = json.loads((folder / "gate.json").read_text())
    path = folder / spec["estimator"]["file"]
    with zipfile.ZipFile(path) as old:
        entries = {name: old.read(name) for name in old.namelist()}
    array = next(name for name in entries if name.endswith(".npy"))
    with open(tmp_path / "object.npy", "wb") as handle:
        np.save(handle, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    entries[array] = (tmp_path / "object.npy").read_bytes()
    with zipfile.ZipFile(path, "w") as new:
        for name, data in entries.items():
            new.writestr(name, data)
    spec["estimator"]["sha256"] = file_sha256(path)  # the file's checksum made to match: the reader must refuse it
    (folder / "gate.json").write_text(json.dumps(spec))
    with pytest.raises(UserError, match=r"is not a gate's skops file \(Object arrays cannot be loaded") as info:
        Gate.load(folder)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("edit, says", [
    (lambda text: text + "\n{nope}", r"template.txt is not the template template this gate was saved with"),
    (lambda text: text + "\nOne more instruction.", r"template.txt is not the template template this gate was saved"),
])
def test_an_edited_template_is_refused_when_the_gate_loads(fitted, tmp_path, edit, says):  # noqa: F811
    folder = copy_of(fitted, tmp_path)
    path = folder / "templates" / "template.txt"
    path.write_text(edit(path.read_text()))
    with pytest.raises(UserError, match=says):
        Gate.load(folder)


def test_a_template_naming_a_field_the_prompt_does_not_fill_is_refused_when_the_gate_loads(fitted, tmp_path):  # noqa
    folder = copy_of(fitted, tmp_path)
    path = folder / "templates" / "template.txt"
    path.write_text(path.read_text() + "\n{nope}")
    spec = json.loads((folder / "gate.json").read_text())
    del spec["templates_sha256"]  # a gate saved before templates were checksummed
    (folder / "gate.json").write_text(json.dumps(spec))
    with pytest.raises(UserError, match=r"it names \{nope\}, which prompt.tools=text does not fill"):
        Gate.load(folder)


@pytest.mark.parametrize("body, kind", [(b"<html><body>hello</body></html>", "text/html"),
                                        (b'{"hello": "world"}', "application/json")])
def test_a_guard_whose_url_is_not_the_gate_says_so_in_one_line(body, kind):
    with StandInGate(body=body, kind=kind) as wrong:
        with pytest.raises(UserError, match=r"not the verdicts of mice-exp serve's /v1/tool_calls/check") as info:
            HttpScorer(wrong.url).score_calls(ask("Weather in Paris?"), [WEATHER], [weather('{"city": "Paris"}')])
    assert "\n" not in str(info.value)
