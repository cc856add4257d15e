"""Gate.score: a call someone else proposed, teacher-forced through the gate's LLM (tiny_random), against Gate.check."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from mice_exp.estimators import MiceLogisticRegression
from mice_exp.gate import Decision, Gate, InvalidRequest
from mice_exp.gate.protocol import completion
from tests.test_gate import WEATHER, ask, fitted, tiny_cfg  # noqa: F401 - fitted: test_gate's saved tiny_random gate

CALL = {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


class Steer(LogitsProcessor):
    """Steers decoding to a fixed reply's tokens. The capture reads each step's raw logits (before any
    processor), so the probabilities recorded are the model's own; only which token comes next is chosen."""

    def __init__(self, reply: list[int]) -> None:
        self.reply, self.start = reply, None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.start = input_ids.shape[1] if self.start is None else self.start
        step = input_ids.shape[1] - self.start
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.reply[min(step, len(self.reply) - 1)]] = 0.0
        return forced


@pytest.fixture
def gate(fitted, tiny_llm):
    # room for a whole call (the fixture's gate generates 6 tokens)
    gate = Gate.load(fitted[0], llm=tiny_llm, engine={"max_new_tokens": 32})
    fs = fitted[2]  # a softer estimator than the fixture's (C=1e6 says 0 or 1): a probability that features move
    gate.estimator = MiceLogisticRegression(C=0.05).fit(fs.X, np.array([1, 1, 0, 0, 1, 1]))
    return gate


def test_scoring_the_gate_s_own_call_gives_check_s_probability(gate, tiny_llm, monkeypatch):
    """tiny_random's greedy replies hold no call, so its decoding is steered to one (:class:`Steer`), its JSON
    indented as STE's demonstrations are; check scores its own call as score scores any call, rendered
    canonically (compact, keys sorted) and teacher-forced, so the call ``mice-exp serve`` hands on (in that
    layout) and the call as the model wrote it both score as check did, up to float rounding."""
    reply = gate.builder().fmt.write("get_weather", '{\n  "city": "Paris"\n}')
    steer = Steer(tiny_llm.tokenizer.encode(reply, add_special_tokens=False))
    generate = tiny_llm.model.generate
    with monkeypatch.context() as patch:
        patch.setattr(tiny_llm.model, "generate",
                      lambda **kw: generate(**kw, logits_processor=LogitsProcessorList([steer])))
        checked = gate.check(ask("What's the weather in Paris?"), [WEATHER])
    assert checked.text == reply and checked.call is not None and checked.call.arguments == {"city": "Paris"}
    handed_on = completion(checked, "gate", on_abstain="pass")["choices"][0]["message"]["tool_calls"][0]
    assert handed_on["function"]["arguments"] == '{"city": "Paris"}'
    as_written = {"type": "function", "function": {"name": "get_weather", "arguments": '{\n  "city": "Paris"\n}'}}
    assert gate.score(ask("What's the weather in Paris?"), [WEATHER], as_written).probability == pytest.approx(
        checked.probability, abs=1e-5)
    scored = gate.score(ask("What's the weather in Paris?"), [WEATHER], handed_on)
    assert isinstance(scored, Decision) and scored.call == checked.call and scored.reason is None
    assert 0.01 < checked.probability < 0.99
    assert scored.probability == pytest.approx(checked.probability, abs=1e-5)
    assert scored.arguments.keys() == checked.arguments.keys() == {"city"}
    assert scored.arguments["city"] == pytest.approx(checked.arguments["city"], rel=1e-4)
    assert (scored.prompt_tokens, scored.completion_tokens) == (checked.prompt_tokens, checked.completion_tokens)
    assert scored.execute == (scored.probability > 0.5)


def test_a_batch_scores_each_call_as_alone(gate):
    calls = [(ask("Weather in Rome?"), [WEATHER], CALL),
             (ask("And in Oslo?"), [WEATHER], {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}})]
    batch = gate.score_batch(calls, tau=0.0)
    alone = [gate.score(*call, tau=0.0) for call in calls]
    assert [d.call.arguments for d in batch] == [{"city": "Paris"}, {"city": "Oslo", "days": 2}]
    assert [d.execute for d in batch] == [True, True] and {d.tau for d in batch} == {0.0}
    # left-padded rows in one pass vs one row per pass: float rounding only
    np.testing.assert_allclose([d.probability for d in batch], [d.probability for d in alone], atol=1e-5)
    for mine, its in zip(batch, alone):
        assert mine.arguments.keys() == its.arguments.keys()
        np.testing.assert_allclose(list(mine.arguments.values()), list(its.arguments.values()), rtol=1e-4)
    assert batch[0].arguments["city"] != batch[1].arguments["city"]  # each row its own call


def test_a_scored_batch_says_where_its_time_went(gate):
    """What ``benchmarks/gate_latency.py`` breaks a scored request's latency into (a batch of 8 on a GPU gained
    less than its forward pass did: this says where the rest went)."""
    gate.score_batch([(ask("Weather in Rome?"), [WEATHER], CALL)] * 3)
    parts = gate.timing
    assert parts.keys() == {"prepare_s", "forward_s", "records_s", "features_s", "total_s"}
    assert min(parts.values()) > 0
    assert sum(parts.values()) - parts["total_s"] <= parts["total_s"]
    gate.check_batch([(ask("Weather in Rome?"), [WEATHER])])  # a check after it reports its own parts only
    assert gate.timing.keys() == {"prepare_s", "generate_s", "features_s", "total_s"}


def test_a_scored_call_s_pass_computes_only_what_the_gate_reads(gate, fitted, monkeypatch):
    """The fixture's cosine view reads hidden states but no logit lens; a confidence-only gate reads neither, so
    its scored call's pass captures no layer (the plain forward pass with the call's logits) and gives the
    probability a pass that captured everything gives."""
    from mice_exp.features import build_features
    from mice_exp.llm import teacher
    from mice_exp.llm.records import read_stage

    assert gate.reads() == (False, True)
    fs = build_features(tiny_cfg("features=conf_only")["features"], read_stage(fitted[3].out), None)
    gate.view, gate.spec["columns"] = fs.view, list(fs.columns)
    gate.estimator = MiceLogisticRegression(C=0.05).fit(fs.X, np.array([1, 1, 0, 0, 1, 1]))
    assert gate.reads() == (False, False)
    captures, capture = [], teacher.layer_states
    monkeypatch.setattr(teacher, "layer_states", lambda *a: captures.append(a) or capture(*a))
    lean = gate.score(ask("Weather in Rome?"), [WEATHER], CALL)
    assert captures == []
    monkeypatch.setattr(Gate, "reads", lambda self: (True, True))
    full = gate.score(ask("Weather in Rome?"), [WEATHER], CALL)
    assert len(captures) == 1
    assert lean.probability == pytest.approx(full.probability, abs=1e-6) and 0.01 < lean.probability < 0.99
    assert (lean.call, lean.text, lean.arguments.keys()) == (full.call, full.text, full.arguments.keys())
    np.testing.assert_allclose(list(lean.arguments.values()), list(full.arguments.values()), rtol=1e-5)


def test_a_mice_gate_s_pass_computes_the_lens_keeps_no_states_and_scores_as_the_full_pass(gate, fitted, tiny_llm,
                                                                                          monkeypatch):
    """A BERTScore view reads each layer's lens string and no hidden state: the pass hands on lens tokens and empty
    states, and the features and probability are the full pass's."""
    from mice_exp.features import build_features
    from mice_exp.llm import teacher
    from mice_exp.llm.records import read_stage

    fs = build_features(tiny_cfg("features=bertscore")["features"], read_stage(fitted[3].out), None)
    gate.view, gate.spec["columns"] = fs.view, list(fs.columns)
    gate.estimator = MiceLogisticRegression(C=0.05).fit(fs.X, np.array([1, 1, 0, 0, 1, 1]))
    assert gate.reads() == (True, False)
    handed: list = []
    score = teacher.score_replies
    monkeypatch.setattr(teacher, "score_replies", lambda *a, **k: handed.extend(score(*a, **k)) or handed[-1:])
    lean = gate.score(ask("Weather in Rome?"), [WEATHER], CALL)
    assert handed[-1].lens_ids.shape[0] == tiny_llm.n_layers - 1 and handed[-1].states.shape[1:] == (0, 0)
    monkeypatch.setattr(Gate, "reads", lambda self: (True, True))
    full = gate.score(ask("Weather in Rome?"), [WEATHER], CALL)
    assert handed[-1].states.shape[1] == tiny_llm.n_layers
    assert lean.probability == pytest.approx(full.probability, abs=1e-6) and 0.01 < lean.probability < 0.99


def test_a_mice_gate_reads_the_lens_and_no_states():
    """The published SmolLM2 gate (bertscore view, MICE RF) reads each layer's lens string, never an array."""
    from mice_exp.paths import PACKAGE_ROOT

    assert Gate.load(PACKAGE_ROOT / "experiments" / "abstention" / "gate-smollm2_135m").reads() == (True, False)


def test_a_teacher_asked_for_neither_lens_nor_states_keeps_none(tiny_llm):
    """What such a pass hands on: each reply token's probability as ever, no lens tokens ([0, T]) and no states
    ([T, 0, 0]), as an endpoint's generations hold none."""
    from mice_exp.llm.teacher import Teacher

    prompts, replies = [[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14]]
    full = Teacher(tiny_llm).score(prompts, replies)
    bare = Teacher(tiny_llm).score(prompts, replies, lens=False, states=False)
    only_lens = Teacher(tiny_llm).score(prompts, replies, states=False)
    for f, b, o in zip(full, bare, only_lens):
        np.testing.assert_allclose(b.token_probs, f.token_probs, rtol=1e-6)
        assert b.lens_ids.shape == (0, len(f.token_ids)) and b.states.shape == (len(f.token_ids), 0, 0)
        np.testing.assert_array_equal(o.lens_ids, f.lens_ids)
        assert o.states.shape == (len(f.token_ids), 0, 0)
        assert f.states.shape == (len(f.token_ids), tiny_llm.n_layers, tiny_llm.hidden_size)


@pytest.mark.parametrize("arguments, reason", [
    ('{"days": 2}', "the call to 'get_weather' lacks the required argument 'city'"),
    ('{"city": 7}', "the call to 'get_weather' has city=7: 7 is not of type 'string'"),
    ('{"city": "Paris", "days": true}', "has days=true: True is not of type 'integer'"),
    ('{"city": "Par', "the arguments of 'get_weather' are not valid JSON"),
    ('["Paris"]', "the arguments of 'get_weather' are list; expected a JSON object"),
])
def test_arguments_that_do_not_match_the_schema_are_denied_with_no_probability(gate, arguments, reason, monkeypatch):
    from mice_exp.llm import teacher

    monkeypatch.setattr(teacher, "score_replies", lambda *a, **k: pytest.fail("a denied call is not scored"))
    decision = gate.score(ask("Weather in Paris?"), [WEATHER], {"name": "get_weather", "arguments": arguments}, tau=0.0)
    assert not decision.execute and decision.call is None and reason in decision.reason
    assert decision.probability is None and decision.arguments == {}


def test_a_tool_not_offered_is_answered_not_raised(gate):
    decision = gate.score(ask("Weather in Paris?"), [WEATHER], {"name": "send_email", "arguments": "{}"}, tau=0.0)
    assert not decision.execute and decision.call is None and decision.probability is None
    assert decision.reason == "the call names 'send_email', which is not among the tools offered (get_weather)"


@pytest.mark.parametrize("call, param, message", [
    ({"type": "function", "id": "call_1"}, "call.function", "call has no 'function' object"),
    ("get_weather(city='Paris')", "call", "expected a tool call"),
    ({"function": {"arguments": "{}"}}, "call.function.name", "call.function.name is None; expected the name of"),
    ({"name": "get_weather", "arguments": 3}, "call.arguments", "call.arguments is 3; expected a JSON object"),
])
def test_a_malformed_call_is_one_line_naming_its_param(gate, call, param, message):
    with pytest.raises(InvalidRequest, match=re.escape(message)) as info:
        gate.score(ask("q"), [WEATHER], call)
    assert info.value.param == param and info.value.status == 400 and "\n" not in str(info.value)


def test_a_bad_request_in_a_batch_is_named_and_nothing_runs(gate, monkeypatch):
    from mice_exp.llm import teacher

    monkeypatch.setattr(teacher, "score_replies", lambda *a, **k: pytest.fail("nothing is scored"))
    with pytest.raises(InvalidRequest, match=r"^request #1: messages\[0\].content: expected the user's text$"):
        gate.score_batch([(ask("q"), [WEATHER], CALL), ([{"role": "user", "content": ""}], [WEATHER], CALL)])
    with pytest.raises(InvalidRequest, match=r"^request #0: call has no 'function' object"):
        gate.score_batch([(ask("q"), [WEATHER], {"type": "function"}), (ask("q"), [WEATHER], CALL)])


def test_a_call_longer_than_the_context_window_is_refused_before_the_forward_pass(gate, monkeypatch):
    from mice_exp.llm import teacher

    monkeypatch.setattr(teacher, "score_replies", lambda *a, **k: pytest.fail("nothing is scored"))
    long = {"name": "get_weather", "arguments": json.dumps({"city": "Paris " * 9000})}
    with pytest.raises(InvalidRequest, match=r"^the call is \d+ tokens after a prompt of \d+; tiny_random's context "
                                             r"window holds 8192 \(llm.context_window\)") as info:
        gate.score(ask("Weather?"), [WEATHER], long)
    assert info.value.code == "context_length_exceeded"


def test_a_gate_refuses_to_score_with_another_llm_in_one_line(fitted):
    """A gate scores under its own LLM and template only: its features and estimator were fitted on that LLM's."""
    from types import SimpleNamespace

    from mice_exp.errors import UserError

    with pytest.raises(UserError, match=r"^the gate needs llm=tiny_random; the model given is smollm2_135m$"):
        Gate.load(fitted[0], llm=SimpleNamespace(name="smollm2_135m"))


@pytest.mark.slow  # the gate's LLM loaded in a fresh process, 2 queries x 3 ways x 2 modes
def test_the_latency_benchmark_runs_on_a_tiny_gate(fitted):
    import os
    import subprocess
    import sys

    from mice_exp.paths import PACKAGE_ROOT

    out = subprocess.run([sys.executable, "benchmarks/gate_latency.py", "--gate", str(fitted[0]), "--apis", "1",
                          "--limit", "2", "--concurrency", "2", "--full-pass"], cwd=PACKAGE_ROOT, capture_output=True,
                         text=True, timeout=600, env=os.environ | {"PYTHONPATH": str(PACKAGE_ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    for line in ("prompt tokens: mean", "sequential", "2 concurrent", "  check    p50", "  score    p50", "  forward  p50",
                 "  forward0 p50", "score / forward at p50", "  full     p50", "score / full pass at p50",
                 "score: 2 concurrent / sequential throughput", "load average at end"):
        assert line in out.stdout
    assert "a scored call's pass computes no logit lens and keeps every layer" in out.stdout  # a cosine view
    assert re.search(r"per request: prompts [\d.]+ ms, teacher-forced pass [\d.]+ ms, records [\d.]+ ms, "
                     r"features \+ estimator [\d.]+ ms, the rest \(the reply's tokens\) -?[\d.]+ ms", out.stdout)
