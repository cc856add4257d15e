"""The deployable gate (mice_exp.gate) on tiny_random: save, reload in a fresh process, refuse bad input."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mice_exp.cache import file_sha256, write_json
from mice_exp.compose import as_plain, compose_config
from mice_exp.errors import UserError
from mice_exp.estimators import MiceLogisticRegression, estimator_classes
from mice_exp.estimators.inputs import OneConfidence
from mice_exp.features import build_features
from mice_exp.gate import Gate, parse_query, read_queries, read_spec, save_gate
from mice_exp.llm.records import read_stage
from mice_exp.data import select_examples
from mice_exp.pipeline import Pipeline
from mice_exp.paths import PACKAGE_ROOT, Paths

FIXTURES = PACKAGE_ROOT / "tests" / "fixtures"
STE_TINY = FIXTURES / "ste_tiny.json"
QUERIES = FIXTURES / "gate_queries.jsonl"
BAD_LINES = {"broken-json": "not valid JSON", "tools-not-a-list": "'tools' must be a string or a non-empty list",
             "unnamed-tools": "API_name: <name>", "no-query": "missing key(s) ['query']"}


def tiny_cfg(*extra: str) -> dict:
    # cosine view: tiny_random writes blank lines, whose BERTScores are all 0; cosines vary per query
    return as_plain(compose_config(["llm=tiny_random", f"dataset.path={STE_TINY}", "llm.batch_size=3",
                                    "llm.max_new_tokens=6", "prompt.k_demos=2", "features=cosine",
                                    "estimator=mice_lr", *extra]))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, tiny_llm):
    """A gate saved from a real LLM stage + feature view, with an estimator fitted on fixed labels."""
    tmp = tmp_path_factory.mktemp("gate")
    cfg = tiny_cfg()
    paths = Paths(root=PACKAGE_ROOT, cache=tmp / "cache")
    pipeline = Pipeline.from_config(cfg, paths, tiny_llm)
    out = pipeline.stage.run()
    fs = build_features(cfg["features"], read_stage(out), paths.features)
    estimator = MiceLogisticRegression(C=1e6).fit(fs.X, np.array([1, 1, 0, 0, 1, 1]))
    folder = save_gate(tmp / "gate", pipeline, estimator, fs.view, select_examples(cfg["dataset"], paths).examples,
                       llm_stage=read_stage(out).info)
    return folder, estimator, fs, SimpleNamespace(cfg=cfg, paths=paths, out=out, pipeline=pipeline)


@pytest.fixture(scope="module")
def answers(fitted, tiny_llm):
    items, places = read_queries(QUERIES)
    return Gate.load(fitted[0], llm=tiny_llm).decide(items, places)


def hexes(answers: list[dict]) -> list[str | None]:
    return [None if a["probability"] is None else float.hex(a["probability"]) for a in answers]


def test_the_saved_folder_is_json_text_and_skops_only(fitted):
    folder, estimator, fs, _ = fitted
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == [
        "demo_pool.jsonl", "estimator.skops", "gate.json", "system.txt", "template.txt", "view.skops"]
    spec = read_spec(folder)
    assert spec["llm"]["name"] == "tiny_random" and spec["features"]["view"] == "cosine"
    assert spec["view"]["class"] == "mice_exp.features.views.CosineView"  # the run's fitted view
    assert spec["columns"] == fs.columns and spec["risk"]["tau"] == 0.5
    assert spec["estimator"]["class"] == "mice_exp.estimators.mice.MiceLogisticRegression"
    assert spec["estimator"]["params"] == {"C": 1e6, "max_iter": 1000}
    reloaded = Gate.load(folder).estimator
    assert np.array_equal(reloaded.predict_proba(fs.X).view(np.uint64), estimator.predict_proba(fs.X).view(np.uint64))


def test_batch_answers_good_lines_and_names_each_bad_one(answers):
    by_id = {a["id"]: a for a in answers}
    assert [a["id"] for a in answers] == ["ste-text", "tool-list", "line 3", "tools-not-a-list", "unnamed-tools", 7,
                                          "no-query"]
    for qid, needle in BAD_LINES.items():
        answer = by_id["line 3" if qid == "broken-json" else qid]
        assert needle in answer["error"] and answer["decision"] is None and answer["probability"] is None
        assert "gate_queries.jsonl:" in answer["error"]  # names the file and line
    for qid in ("ste-text", "tool-list", 7):
        answer = by_id[qid]
        assert answer["error"] is None and 0.0 <= answer["probability"] <= 1.0 and answer["tau"] == 0.5
        assert answer["decision"] == ("execute" if answer["probability"] > 0.5 else "abstain")
        assert set(answer["call"]) == {"api", "args"} and isinstance(answer["text"], str)
    assert len({by_id[q]["probability"] for q in ("ste-text", "tool-list", 7)}) == 3  # not a constant


def test_each_answer_says_how_sure_the_llm_is_of_each_argument(answers):
    good = [a for a in answers if a["error"] is None]
    assert good and all(a["arguments"] is None and a["arguments_error"] is None for a in answers if a["error"])
    for answer in good:
        args = answer["call"]["args"]
        if args is None:  # tiny_random's random text: unparseable, so no argument and one line saying why
            assert answer["arguments"] == {} and answer["arguments_error"].endswith(f"({answer['parse_error']})")
        else:
            assert answer["arguments_error"] is None and set(answer["arguments"]) == set(args)
            assert all(0.0 <= p <= 1.0 for p in answer["arguments"].values())


#: A record of a parsed ReAct call (tiny_random's own replies never parse): its tokens
#: ... | {"city": | "Paris" | , "days": | 3}, "Paris" at 0.5 and 3 at 0.25.
PARSED = {"pred_api": "get_weather", "pred_args": {"city": "Paris", "days": 3},
          "text": 'Action: get_weather\nAction Input: {"city": "Paris", "days": 3}',
          "offsets": [(0, 33), (33, 42), (42, 50), (50, 59), (59, 62)], "token_ids": [1, 2, 3, 4, 5],
          "token_probs": [1.0, 1.0, 0.5, 1.0, 0.25], "raw_confidence": 0.125, "parse_error": None, "prompt_tokens": 40}


def test_a_parsed_call_gets_the_token_product_of_each_argument(fitted, tiny_llm):
    gate = Gate.load(fitted[0], llm=tiny_llm)
    answer = gate._answer("q", PARSED, 0.7)
    assert answer["arguments"] == {"city": 0.5, "days": 0.25} and answer["arguments_error"] is None
    assert answer["decision"] == "execute"


def test_a_gate_reports_each_argument_under_the_rule_it_saved(fitted, tiny_llm, tmp_path):
    folder = shutil.copytree(fitted[0], tmp_path / "lens")
    spec = json.loads((folder / "gate.json").read_text())
    write_json(folder / "gate.json", spec | {"arguments": {"rule": "lens"}})
    lens = PARSED | {"lens_ids": [[1, 2, 3, 4, -1]] * 2}  # both lens layers predict "Paris", neither 3
    assert Gate.load(folder, llm=tiny_llm)._answer("q", lens, 0.7)["arguments"] == {"city": 1.0, "days": 0.0}


# Runs the CLI in a fresh interpreter and records whether anything was unpickled meanwhile.
FRESH = textwrap.dedent("""
    import sys
    unpickled = []
    sys.addaudithook(lambda event, args: unpickled.append(args) if event == "pickle.find_class" else None)
    from mice_exp.gate.command import main
    sys.argv = ["mice-exp", *sys.argv[1:]]
    main()
    print("UNPICKLED", len(unpickled), unpickled[:3], file=sys.stderr)
""")


def test_a_fresh_process_reproduces_the_probabilities_bit_for_bit_without_unpickling(fitted, answers, tmp_path):
    out = tmp_path / "answers.jsonl"
    done = subprocess.run([sys.executable, "-c", FRESH, f"model={fitted[0]}", f"input={QUERIES}", f"output={out}"],
                          cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "UNPICKLED 0 []" in done.stderr
    fresh = [json.loads(line) for line in out.read_text().splitlines()]
    assert [json.loads(line) for line in done.stdout.splitlines()] == fresh
    assert hexes(fresh) == hexes(answers)
    assert fresh == answers
    assert "gate: 7 queries" in done.stderr and "error 4" in done.stderr


def test_a_gate_refuses_a_config_for_another_llm_or_feature_view(fitted):
    with pytest.raises(UserError, match=r"saved for llm=tiny_random .* asks for llm=smollm2_135m"):
        Gate.load(fitted[0], expect=tiny_cfg("llm=smollm2_135m"))
    with pytest.raises(UserError, match=r"features=cosine but the config asks for features=bertscore"):
        Gate.load(fitted[0], expect=tiny_cfg("features=bertscore"))
    with pytest.raises(UserError, match=r"llm.max_new_tokens=6 in the gate but 7"):
        Gate.load(fitted[0], expect=tiny_cfg("llm.max_new_tokens=7"))
    Gate.load(fitted[0], expect=tiny_cfg("llm.device=cpu", "llm.batch_size=1"))  # where it runs is not identity


def test_a_gate_saved_with_dtype_auto_runs_where_the_config_resolves_auto_alike(fitted, tmp_path):
    """A gate saved before dtypes were resolved (``llm.dtype: auto``, as the published SmolLM2 gate) against a
    command's config, whose ``auto`` is resolved for its device: float32 on a CPU."""
    import shutil

    gate = shutil.copytree(fitted[0], tmp_path / "gate")
    spec = json.loads((gate / "gate.json").read_text())
    (gate / "gate.json").write_text(json.dumps(spec | {"llm": spec["llm"] | {"dtype": "auto"}}))
    Gate.load(gate, expect=tiny_cfg("llm.dtype=float32"))
    with pytest.raises(UserError, match=r"llm.dtype='float32' in the gate but 'bfloat16' in the config"):
        Gate.load(gate, expect=tiny_cfg("llm.dtype=bfloat16"))


def test_the_commands_run_a_gate_on_the_engine_they_are_told(fitted):
    """``mice-exp serve model=GATE llm.backend=vllm``: what runs the LLM is not the gate's identity either."""
    from mice_exp.gate.command import load_gate

    assert Gate.load(fitted[0]).llm_settings.backend == "hf"
    on_engine = load_gate({"model": str(fitted[0])}, ["llm.backend=vllm"], tiny_cfg("llm.backend=vllm"))
    assert on_engine.llm_settings.backend == "vllm"


def test_the_command_refuses_a_mismatch_in_one_line(fitted, monkeypatch, capsys):
    from mice_exp.gate.command import main

    monkeypatch.setattr(sys, "argv", ["mice-exp", f"model={fitted[0]}", f"input={QUERIES}", "llm=smollm2_135m"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1
    assert err[0].startswith("mice-exp: error: the gate ") and "llm=smollm2_135m" in err[0]


def test_a_gate_refuses_an_llm_with_other_weights(fitted, tiny_llm, tmp_path):
    folder = copy_gate(fitted[0], tmp_path / "other")
    spec = json.loads((folder / "gate.json").read_text())
    spec["llm_stage"]["n_layers"] = tiny_llm.n_layers + 1
    write_json(folder / "gate.json", spec)
    with pytest.raises(UserError, match=f"n_layers={tiny_llm.n_layers + 1}; the loaded model has {tiny_llm.n_layers}"):
        Gate.load(folder, llm=tiny_llm)


def copy_gate(src: Path, dst: Path) -> Path:
    for path in src.rglob("*"):
        if path.is_file():
            (dst / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (dst / path.relative_to(src)).write_bytes(path.read_bytes())
    return dst


def test_loading_refuses_untrusted_types_and_runs_nothing(fitted, tmp_path):
    import skops.io as sio

    folder = copy_gate(fitted[0], tmp_path / "evil")
    marker = tmp_path / "pwned"
    evil = MiceLogisticRegression().fit(np.eye(4), [0, 1, 0, 1])
    evil.model_ = functools.partial(os.system, f"touch {marker}")
    (folder / "estimator.skops").write_bytes(sio.dumps(evil))
    with pytest.raises(UserError, match="does not match the checksum"):
        Gate.load(folder)  # swapped file: refused before skops looks at it
    spec = json.loads((folder / "gate.json").read_text())
    spec["estimator"]["sha256"] = file_sha256(folder / "estimator.skops")  # an attacker fixes the checksum too
    write_json(folder / "gate.json", spec)
    with pytest.raises(UserError, match=r"contains types a gate does not trust: functools.partial, posix.system"):
        Gate.load(folder)
    assert not marker.exists()


def test_a_pca_gate_keeps_the_run_s_projections_and_scores_its_records_as_the_run_did(fitted, tiny_llm, tmp_path):
    run = fitted[3]
    cfg = tiny_cfg("features=pca10", "features.components=2")  # 3 training calls give at most 3 components
    stage = read_stage(run.out)
    fs = build_features(cfg["features"], stage, run.paths.features)
    estimator = MiceLogisticRegression(C=1e6).fit(fs.X, np.array([1, 1, 0, 0, 1, 1]))
    pipeline = Pipeline.from_config(cfg, run.paths)
    folder = save_gate(tmp_path / "pca", pipeline, estimator, fs.view, run.pipeline.demo_pool(), llm_stage=stage.info)
    assert read_spec(folder)["view"]["class"] == "mice_exp.features.views.PcaView"
    gate = Gate.load(folder, llm=tiny_llm)
    again = gate.features(stage)  # the run's records through the loaded view: nothing is fitted again
    assert again.columns == fs.columns == gate.columns and again.columns[:2] == ["pca_L1_0", "pca_L1_1"]
    assert np.array_equal(again.X.view(np.uint64), fs.X.view(np.uint64))
    run_p = estimator.predict_proba(fs.X)[:, 1]
    assert np.array_equal(gate.probabilities(again).view(np.uint64), run_p.view(np.uint64))
    items, places = read_queries(QUERIES)  # new queries: the saved projections transform them (none are training rows)
    assert len({a["probability"] for a in gate.decide(items, places) if a["error"] is None}) == 3


def test_a_gate_fitted_on_a_gpu_serves_on_a_cpu_where_it_is_told_to(fitted, tiny_llm, tmp_path):
    """A run on a GPU machine keeps BERTScore's and the retrieval's encoders there too; its gate, loaded on a
    machine without one, says so in one line, and ``device=cpu`` moves every model it runs (the LLM, both
    encoders) to the CPU, where it answers as a gate fitted there does."""
    import torch

    run = fitted[3]
    stage = read_stage(run.out)
    fs = build_features(tiny_cfg("features=bertscore")["features"], stage, run.paths.features)
    estimator = MiceLogisticRegression(C=1.0).fit(fs.X, np.array([1, 1, 0, 0, 1, 1]))
    folders = {}
    for device in ("cpu", "cuda"):
        cfg = tiny_cfg("features=bertscore", f"features.encoder.device={device}", f"retrieval.device={device}")
        view = fs.view.set_params(encoder={**fs.view.encoder, "device": device})
        folders[device] = save_gate(tmp_path / device, Pipeline.from_config(cfg, run.paths), estimator, view,
                                    run.pipeline.demo_pool(), llm_stage=stage.info)
    items, places = read_queries(QUERIES)
    if not torch.cuda.is_available():  # this machine has no GPU, as the one the gate was fitted on had
        with pytest.raises(UserError, match=r"^retrieval.device=cuda but no CUDA device is visible; expected "
                                            r"retrieval.device=cpu or auto$"):
            Gate.load(folders["cuda"], llm=tiny_llm).decide(items, places)
    moved = Gate.load(folders["cuda"], llm=tiny_llm, device="cpu")
    assert moved.view.encoder["device"] == moved.retrieval_settings.device == "cpu"
    on_cpu = hexes(Gate.load(folders["cpu"], llm=tiny_llm).decide(items, places))
    assert hexes(moved.decide(items, places)) == on_cpu
    spec = json.loads((folders["cuda"] / "gate.json").read_text())  # as saved before gates kept their view: its
    del spec["view"]                                                 # view is built from gate.json's features
    write_json(folders["cuda"] / "gate.json", spec)
    (folders["cuda"] / "view.skops").unlink()
    older = Gate.load(folders["cuda"], llm=tiny_llm, device="cpu")
    assert older.view is None and hexes(older.decide(items, places)) == on_cpu


def test_a_changed_view_file_is_refused_by_its_checksum_in_one_line(fitted, tmp_path):
    import skops.io as sio

    from mice_exp.features.views import CosineView

    folder = copy_gate(fitted[0], tmp_path / "changed")
    (folder / "view.skops").write_bytes(sio.dumps(CosineView(layers=[1]).fit(read_stage(fitted[3].out))))
    with pytest.raises(UserError, match=r"view.skops does not match the checksum in gate.json") as info:
        Gate.load(folder)
    assert "\n" not in str(info.value)


def test_a_gate_saved_before_gates_kept_their_view_still_answers_the_same(fitted, answers, tiny_llm, tmp_path):
    folder = copy_gate(fitted[0], tmp_path / "older")
    spec = json.loads((folder / "gate.json").read_text())
    del spec["view"]
    write_json(folder / "gate.json", spec)
    (folder / "view.skops").unlink()
    gate = Gate.load(folder, llm=tiny_llm)  # its stateless view is built from gate.json, as then
    assert gate.view is None
    assert hexes(gate.decide(*read_queries(QUERIES))) == hexes(answers)


class Rescaled(MiceLogisticRegression):
    """A new estimator class, defined outside mice_exp.estimators."""


def test_a_new_estimator_is_trusted_once_mice_exp_estimators_exports_it(monkeypatch, tmp_path):
    import skops.io as sio

    import mice_exp.estimators
    from mice_exp.gate.artifact import class_path, load_estimator

    path = tmp_path / "estimator.skops"
    path.write_bytes(sio.dumps(Rescaled().fit(np.eye(4), [0, 1, 0, 1])))
    with pytest.raises(UserError, match=r"names estimator class 'test_gate.Rescaled'; a gate holds one of .*Raw"):
        load_estimator(path, "test_gate.Rescaled")
    monkeypatch.setattr(mice_exp.estimators, "Rescaled", Rescaled, raising=False)  # what its module's export does
    assert class_path(load_estimator(path, "test_gate.Rescaled")) == "test_gate.Rescaled"


def test_a_new_estimator_module_is_trusted_without_an_export(monkeypatch, tmp_path):
    """A new estimator is its module in mice_exp/estimators and its YAML: a gate finds and trusts its class."""
    import sys

    import mice_exp.estimators
    from mice_exp.gate.artifact import trusted_types

    (tmp_path / "scaled.py").write_text("from mice_exp.estimators.raw import RawConfidence\n\n\n"
                                        "class Scaled(RawConfidence):\n    pass\n")
    monkeypatch.setattr(mice_exp.estimators, "__path__", [*mice_exp.estimators.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "mice_exp.estimators.scaled", raising=False)
    assert "mice_exp.estimators.scaled.Scaled" in trusted_types()
    sys.modules.pop("mice_exp.estimators.scaled", None)


@pytest.mark.parametrize("estimator", [cls() for cls in estimator_classes() if cls.gate_refuses is None],
                         ids=lambda e: type(e).__name__)
def test_every_estimator_a_gate_may_hold_loads_with_the_types_it_declares(estimator, tmp_path):
    """A fitted estimator holds only skops' defaults and what its class declares (``holds``), so no
    gate fails at the end of a run for a type nobody listed (a field correction's torch network is
    refused before: a gate does not save it)."""
    import skops.io as sio

    from mice_exp.gate.artifact import class_path, load_estimator, trusted_types

    if "n_estimators" in estimator.get_params():
        estimator.set_params(n_estimators=3, n_jobs=1)
    rng = np.random.default_rng(0)
    X, y = rng.random((40, 1 if isinstance(estimator.reads, OneConfidence) else 4)), np.arange(40) % 2
    path = tmp_path / "estimator.skops"
    path.write_bytes(sio.dumps(estimator.fit(X, y)))
    assert set(sio.get_untrusted_types(file=path)) <= trusted_types()
    loaded = load_estimator(path, class_path(estimator))
    np.testing.assert_array_equal(loaded.predict_proba(X), estimator.predict_proba(X))


def test_save_refuses_what_a_gate_could_not_rebuild_or_load(fitted, tmp_path):
    _, estimator, fs, _ = fitted
    paths = Paths(root=PACKAGE_ROOT, cache=tmp_path)
    pool = select_examples(tiny_cfg()["dataset"], paths).examples

    def pipeline(*overrides: str) -> Pipeline:
        return Pipeline.from_config(tiny_cfg(*overrides), paths)

    with pytest.raises(UserError, match="estimator.source='p_true': a gate computes the raw confidence only"):
        save_gate(tmp_path / "g", pipeline("estimator=p_true", "sources.use=[p_true]"), estimator, fs.view, pool)
    with pytest.raises(UserError, match=r"features.sources=\['verbalized'\]"):
        save_gate(tmp_path / "g", pipeline("features.sources=[verbalized]", "sources.use=[verbalized]"), estimator,
                  fs.view, pool)
    with pytest.raises(UserError, match="the demo pool has 1 examples; prompt.k_demos=2"):
        save_gate(tmp_path / "g", pipeline(), estimator, fs.view, pool[:1])
    narrow = MiceLogisticRegression().fit(fs.X[:, :3], np.array([1, 1, 0, 0, 1, 1]))
    with pytest.raises(UserError, match="fitted on 3 columns; the feature view has 4"):
        save_gate(tmp_path / "g", pipeline(), narrow, fs.view, pool)


@pytest.mark.parametrize("estimator", ["probe_last", "probe_best_layer", "mahalanobis"])
def test_hidden_state_estimators_are_not_saved_as_gates(estimator):
    pipeline = Pipeline.from_config(compose_config([f"estimator={estimator}"]))
    assert pipeline.gate_unsupported().startswith(f"estimator={estimator}: it reads the LLM's last_token hidden states")


@pytest.mark.parametrize("item, message", [
    ({"query": "q", "tools": []}, "non-empty list of objects"),
    ({"query": "q", "tools": [{"description": "no name"}]}, "non-empty list of objects"),
    ({"query": "q", "tools": "no names here"}, "tool_names"),
    ({"query": "q", "tools": "text", "tool_names": "a"}, "tool_names"),
    ({"query": "", "tools": [{"name": "a"}]}, "'query' must be a non-empty string"),
    ({"id": [1], "query": "q", "tools": [{"name": "a"}]}, "'id' must be a string or an integer"),
    (["not", "a", "dict"], "expected a JSON object"),
])
def test_malformed_queries_are_user_errors(item, message):
    with pytest.raises(UserError, match=message):
        parse_query(item, 0)


def test_good_queries_become_examples():
    text = parse_query({"id": "a", "query": "q", "tools": "API_name: f\nDescription: d"}, 0)
    assert text.tool_names == ("f",) and text.tools.startswith("API_name: f")
    listed = parse_query({"query": "q", "tools": [{"name": "f"}, {"name": "g"}]}, 3)
    assert listed.tool_names == ("f", "g") and listed.id == "gate/3"


@pytest.mark.filterwarnings("ignore::mice_exp.estimators.FallbackWarning")  # tiny_random gets no call right
def test_fit_gate_builds_one_from_a_config_reusing_the_llm_stage(fitted, tmp_path, monkeypatch):
    import mice_exp.llm.runner as runner
    from mice_exp.gate import fit_gate

    _, _, fs, run = fitted
    monkeypatch.setattr(runner, "generate_batch", lambda *a, **k: pytest.fail("generated again"))
    spec = read_spec(fit_gate(run.cfg, tmp_path / "fit", paths=run.paths))
    assert spec["columns"] == fs.columns and spec["estimator"]["key"] == "mice_lr"
    # tiny_random's calls never parse: no wrong argument to localise, so the token product
    assert spec["arguments"] == {"rule": "product", "calls": 0,
                                 "localization": dict.fromkeys(("product", "lens", "min_token", "mean_token"))}
    assert spec["provenance"]["llm_cache"] == run.out.name and spec["demo_pool"]["size"] == 3  # the training calls (prompt.demo_pool=train)


def test_a_run_without_tracking_keeps_its_gate_in_the_cache(fitted):
    from mice_exp.gate import save_run_gate
    from mice_exp.tracking import NullRun

    _, estimator, fs, run = fitted
    saved = save_run_gate(run.pipeline, read_stage(run.out), fs, estimator, NullRun())
    folder = Path(saved["folder"])
    assert folder.parent == run.paths.cache / "gates" and read_spec(folder)["columns"] == fs.columns
    assert save_run_gate(run.pipeline, read_stage(run.out), fs, None, NullRun()) == {}  # loao: no single model
    for unsaved in (["estimator=p_true", "sources.use=[p_true]"], ["gate.save=false"]):  # p_true: a source the gate lacks
        pipeline = Pipeline.from_config(tiny_cfg(*unsaved), run.paths)
        assert save_run_gate(pipeline, read_stage(run.out), fs, estimator, NullRun()) == {}


@pytest.mark.slow
def test_a_run_logs_and_registers_its_gate_and_every_uri_loads_it(fitted, tmp_path):
    from mice_exp.gate import save_run_gate
    from mice_exp.tracking import tracked_run

    _, estimator, fs, run = fitted
    tracking = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "gate-test", "enabled": True}
    with tracked_run(tracking, tmp_path, run_name="gate") as tracker:
        saved = save_run_gate(run.pipeline, read_stage(run.out), fs, estimator, tracker)
    name = "mice_exp-gate-tiny_random-cosine-mice_lr"
    assert saved == {"uri": f"runs:/{tracker.run_id}/gate", "model": name, "version": 1}
    for source in (saved["uri"], f"models:/{name}/1", f"models:/{name}/latest"):
        gate = Gate.load(source, tracking=tracking, root=tmp_path)
        assert gate.columns == fs.columns and gate.spec["provenance"]["run_id"] == tracker.run_id
        assert np.array_equal(gate.estimator.predict_proba(fs.X), estimator.predict_proba(fs.X))
    with pytest.raises(UserError, match="model=runs:/nope/gate: MLflow could not provide it"):
        Gate.load("runs:/nope/gate", tracking=tracking, root=tmp_path)
    with tracked_run(tracking, tmp_path, run_name="again") as again:  # the same pipeline run a second time
        assert save_run_gate(run.pipeline, read_stage(run.out), fs, estimator, again)["version"] == 2
    assert Gate.load(f"models:/{name}/latest", tracking=tracking, root=tmp_path).spec["provenance"]["run_id"] == again.run_id


# --- the Python API: Gate.check on OpenAI-style chat requests ------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Forecast for a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "description": "The city's name."},
                                     "days": {"type": "integer", "default": 1}},
    "required": ["city"]}}}


def ask(text: str) -> list[dict]:
    return [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": text}]


def test_check_answers_a_chat_request_with_a_typed_decision(fitted, tiny_llm):
    from mice_exp.gate import Decision

    gate = Gate.load(fitted[0], llm=tiny_llm)
    decision = gate.check(ask("What's the weather in Paris?"), [WEATHER])
    assert isinstance(decision, Decision) and 0.0 <= decision.probability <= 1.0 and decision.tau == 0.5
    # tiny_random's random text holds no call: nothing to execute, whatever the probability, and why
    assert decision.call is None and decision.arguments == {} and not decision.execute
    assert decision.parse_error == "no 'Action:' line" and decision.text.strip() == ""
    assert decision.prompt_tokens > 100 and decision.completion_tokens == 6  # llm.max_new_tokens
    assert gate.check(ask("What's the weather in Paris?"), [WEATHER], tau=0.0).tau == 0.0
    batch = gate.check_batch([(ask("Weather in Rome?"), [WEATHER]), (ask("And in Oslo?"), [WEATHER])], tau=0.9)
    assert [type(d) for d in batch] == [Decision, Decision] and {d.tau for d in batch} == {0.9}


def test_a_parsed_call_is_executed_above_tau_and_names_its_least_certain_argument(fitted, tiny_llm):
    from mice_exp.gate import Call

    gate = Gate.load(fitted[0], llm=tiny_llm)
    decision = gate._decision(PARSED, 0.7, 0.5, ["get_weather"])
    assert decision.call == Call("get_weather", {"city": "Paris", "days": 3}) and decision.execute
    assert decision.arguments == {"city": 0.5, "days": 0.25} and decision.least_certain == "days"
    assert not gate._decision(PARSED, 0.7, 0.7, ["get_weather"]).execute  # execute iff p > tau
    elsewhere = gate._decision(PARSED, 0.7, 0.5, ["add_date"])  # a demonstration's tool, not one the caller offered
    assert elsewhere.call is None and not elsewhere.execute and elsewhere.arguments == {}
    assert elsewhere.parse_error == "the reply calls 'get_weather', which is not among the tools offered (add_date)"


def test_schema_tools_reach_an_ste_gate_in_its_text_form(fitted):
    from mice_exp.data.schemas import ste_text, tool_schemas
    from mice_exp.gate.chat import chat_example

    text = chat_example(ask("q"), [WEATHER], 0, schemas=False).tools
    assert text.startswith('API_name: get_weather\nDescription: {"description": "Forecast for a city."')
    (back,) = tool_schemas(text, "x")
    assert back["function"]["parameters"]["required"] == ["city"]
    assert back["function"]["parameters"]["properties"]["days"] == {"type": "integer", "description": "", "default": 1}
    run = fitted[3]
    ste = {e.api: e for e in select_examples(run.cfg["dataset"], run.paths).examples}
    for api in ("BART%%Advisory information", "Car database%%Makes"):  # RapidAPI's form: the text round-trips
        (schema,) = ste[api].schemas
        assert tool_schemas(ste_text(schema), api) == [schema]
    assert json.loads(chat_example(ask("q"), [WEATHER], 0, schemas=True).tools) == [WEATHER]  # json_tools: as given


@pytest.mark.parametrize("messages, tools, param, message", [
    (ask("q"), None, "tools", "Missing required parameter: 'tools'"),
    (ask("q"), [], "tools", "expected a non-empty list"),
    (ask("q"), [{"name": "f"}], "tools[0]", 'expected {"type": "function"'),
    (ask("q"), [{"type": "function", "function": {"name": " f"}}], "tools[0].function.name", "one-line string"),
    (ask("q"), [WEATHER, WEATHER], "tools[1].function.name", "a second tool named 'get_weather'"),
    (ask("q"), [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": ["x"]}}}],
     "tools[0].function.parameters", "Invalid schema for function 'f': 'required' names 'x'"),
    (ask("q"), [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
     "tools[0].function.parameters", "not a JSON schema of type 'object'"),
    (None, [WEATHER], "messages", "Missing required parameter: 'messages'"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], [WEATHER], "messages[1].role",
     "expected the conversation to end with a user message"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], [WEATHER],
     "messages[0].content", "text parts only"),
    ([{"role": "robot", "content": "q"}], [WEATHER], "messages[0].role", "expected an object with a role"),
    (ask("q"), [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "unit": {"type": "string", "enum": ["C", "F"]}}}}}], "tools",
     "parameter 'unit' has 'enum', which STE's text form cannot show; the gate was trained on prompt=ste and needs "
     "prompt=json_tools"),
])
def test_a_bad_chat_request_is_one_line_naming_its_param(messages, tools, param, message):
    from mice_exp.gate import InvalidRequest
    from mice_exp.gate.chat import chat_example

    with pytest.raises(InvalidRequest, match=re.escape(message)) as info:
        chat_example(messages, tools, 0, schemas=False)
    assert info.value.param == param and info.value.status == 400 and "\n" not in str(info.value)


def test_a_request_longer_than_the_context_window_is_refused_before_generating(fitted, tiny_llm):
    from mice_exp.gate import InvalidRequest

    gate = Gate.load(fitted[0], llm=tiny_llm)
    with pytest.raises(InvalidRequest, match=r"has \d+ tokens without demonstrations; tiny_random's context window "
                                             r"leaves 8186") as info:
        gate.check(ask("weather " * 9000), [WEATHER])
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(InvalidRequest, match=r"tau=1.5; expected a number in \[0, 1\]"):
        gate.check(ask("q"), [WEATHER], tau=1.5)
