"""Published records files: written from a stage cache, read back without an LLM, refused clearly when bad."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mice_exp.compose import as_plain, compose_config
from mice_exp.errors import UserError
from mice_exp.features import build_features
from mice_exp.llm.publish import publish_records
from mice_exp.llm.records import PUBLISHED, REQUIRED, Record, read_records_file, read_stage
from mice_exp.paths import PACKAGE_ROOT, Paths
from tests.conftest import stage_of
from tests.test_llm_stage import FIXTURE, tiny_cfg


@pytest.fixture(scope="module")
def published(tmp_path_factory, tiny_llm):
    """A tiny stage cache and the records file published from it."""
    tmp = tmp_path_factory.mktemp("records")
    stage = stage_of(tiny_cfg(), Paths(root=PACKAGE_ROOT, cache=tmp / "cache"), tiny_llm)
    return stage.run(), publish_records(stage, {"use": []}, tmp / "ste-tiny.jsonl.gz")


def test_a_records_file_holds_the_stage_records_without_activations(published):
    out, path = published
    stage, file = read_stage(out), read_records_file(path, dataset="ste")
    assert file.ids == stage.ids
    assert [r["label"] for r in file.records] == [r["label"] for r in stage.records]
    assert [r["layer_strings"] for r in file.records] == [r["layer_strings"] for r in stage.records]
    assert file.info["accuracy"] == stage.info["accuracy"] and file.n_layers == stage.n_layers
    assert all("offsets" in r for r in file.records)
    assert [r["lens_ids"] for r in file.records] == [r["lens_ids"] for r in stage.records]  # lens agreement from files
    with pytest.raises(UserError, match="not in a records file"):
        file.arrays("mean_pool")


def test_the_stage_writes_and_a_records_file_keeps_exactly_the_record_type_s_fields(published):
    """``Record`` is the one list of fields: what the stage writes, what a records file keeps, what every run reads."""
    out, path = published
    assert all(set(r) == set(Record.__annotations__) for r in read_stage(out).records)
    assert all(set(r) == set(PUBLISHED) for r in read_records_file(path, dataset="ste").records)
    assert set(REQUIRED) < set(PUBLISHED)


def test_a_records_file_names_the_commit_that_wrote_it(published):
    import subprocess

    from mice_exp.llm.records import read_records_header

    head = subprocess.run(["git", "-C", str(PACKAGE_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    (step,) = read_records_header(published[1])["written_by"]
    assert step["wrote"] == "the stage" and step["commit"] == head.stdout.strip()


def test_the_same_records_give_the_same_bytes(published, tmp_path):
    out, path = published
    again = publish_records(stage_of(tiny_cfg(), Paths(root=PACKAGE_ROOT, cache=out.parents[1])), {"use": []},
                            tmp_path / "again.jsonl.gz")
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("view", ["conf_only", "bertscore"])
def test_features_from_the_file_equal_features_from_the_cache(published, tmp_path, view):
    out, path = published
    features = as_plain(compose_config(["llm=tiny_random", f"features={view}"]))["features"]
    from_cache = build_features(features, read_stage(out), tmp_path / "a")
    from_file = build_features(features, read_records_file(path), tmp_path / "b")
    assert from_file.columns == from_cache.columns
    np.testing.assert_array_equal(from_file.X, from_cache.X)  # same strings, same encoder: same scores
    np.testing.assert_array_equal(from_file.labels, from_cache.labels)


def _rewrite(path: Path, target: Path, edit) -> Path:
    with gzip.open(path, "rt") as handle:
        lines = handle.read().splitlines()
    with gzip.open(target, "wt") as handle:
        handle.write("\n".join(edit(lines)) + "\n")
    return target


@pytest.mark.parametrize("damage,message", [
    (lambda p, t: t, "no such file"),
    (lambda p, t: (t.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), t)[1], "truncated"),
    (lambda p, t: _rewrite(p, t, lambda lines: lines[:-1]), "truncated"),
    (lambda p, t: _rewrite(p, t, lambda lines: [json.dumps({"hello": 1})] + lines[1:]), "not a mice_exp records file"),
    (lambda p, t: _rewrite(p, t, lambda lines: [json.dumps(json.loads(lines[0]) | {"dataset": "bfcl"})] + lines[1:]),
     "holds 'bfcl' calls"),
    (lambda p, t: _rewrite(p, t, lambda lines: lines[:1] + [json.dumps({k: v for k, v in json.loads(x).items()
                                                                        if k != "layer_strings"}) for x in lines[1:]]),
     "lack 'layer_strings'"),
    (lambda p, t: _rewrite(p, t, lambda lines: lines[:1] + [json.dumps({k: v for k, v in json.loads(x).items()
                                                                        if k != "pred_api"}) for x in lines[1:]]),
     r"6 records lack 'pred_api' \(first on line 2\)"),
    (lambda p, t: _rewrite(p, t, lambda lines: lines[:1] + [lines[1], lines[1]] + lines[3:]),
     r"line 3 repeats id '[^']+' \(first on line 2\)"),
    (lambda p, t: _rewrite(p, t, lambda lines: lines[:2] + [json.dumps(json.loads(lines[2]) | {"label": "1"})]
                           + lines[3:]), r"line 3 \('[^']+'\) has label='1'; expected 0 or 1"),
    (lambda p, t: _rewrite(p, t, lambda lines: lines[:2] + [json.dumps(json.loads(lines[2]) | {"label": 2})]
                           + lines[3:]), r"has label=2; expected 0 or 1"),
    (lambda p, t: _rewrite(p, t, lambda lines: lines[:2] + [json.dumps(json.loads(lines[2]) | {"split": "dev"})]
                           + lines[3:]), r"has split='dev'; expected train, validation or test"),
    (lambda p, t: _rewrite(p, t, lambda lines: [json.dumps(json.loads(lines[0]) | {"llm": "smollm2_135m"})]
                           + lines[1:]), r"written with llm='smollm2_135m'; this run has llm.name='tiny_random'"),
])
def test_a_bad_records_file_is_one_line_naming_it(published, tmp_path, damage, message):
    bad = damage(published[1], tmp_path / "bad.jsonl.gz")
    with pytest.raises(UserError, match=message) as error:
        read_records_file(bad, dataset="ste", expect={"llm": "tiny_random", "demo_pool": "train"})
    assert "\n" not in str(error.value) and str(bad) in str(error.value)


def test_a_records_file_is_cut_to_the_runs_dataset_selection(published):
    """dataset.apis / max_apis / max_per_api pick from a records file as from the data set."""
    path = published[1]
    whole = read_records_file(path, dataset="ste")
    first_api = sorted({r["api"] for r in whole.records})[0]
    splits = {r["id"]: r["split"] for r in whole.records if r["api"] == first_api}
    cut = read_records_file(path, dataset="ste", splits=splits)
    assert cut.ids == [i for i in whole.ids if i in splits] and 0 < len(cut.ids) < len(whole.ids)
    assert cut.info["examples"] == len(splits) and cut.key != whole.key  # its own feature caches
    assert read_records_file(path, splits={r["id"]: r["split"] for r in whole.records}).key == whole.key


@pytest.mark.parametrize("change,message", [
    (lambda splits: splits | {"ste/elsewhere/0": "test"}, "holds 6 of the 7 calls this run's dataset selection picks"),
    (lambda splits: splits | {k: "test" if v == "train" else "train" for k, v in list(splits.items())[:2]},
     "2 calls lie in another split than this run's dataset.split and seed assign"),
])
def test_a_records_file_from_another_selection_is_one_line(published, change, message):
    path = published[1]
    splits = change({r["id"]: r["split"] for r in read_records_file(path).records})
    with pytest.raises(UserError, match=message) as error:
        read_records_file(path, splits=splits)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_a_run_from_records_loads_no_llm(published, tmp_path):
    """llm.records=... runs the estimation stage with neither torch nor transformers imported."""
    script = (
        "import sys\n"
        "from mice_exp.compose import compose_config\n"
        "from mice_exp.run import run\n"
        f"out = run(compose_config(['llm=tiny_random', 'llm.records={published[1]}', 'features=conf_only',\n"
        f"    'estimator=mice_lr', 'tracking.enabled=false', 'permutations=0', 'gate.save=false',\n"
        f"    'paths.cache={tmp_path}', 'dataset.path={FIXTURE}', 'llm.max_new_tokens=6', 'prompt.k_demos=2']))\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'an LLM library was imported'\n"
        "print(out['llm_examples'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "6"


def test_a_records_file_of_other_prompt_settings_is_refused(published, tmp_path):
    """Every prompt setting and the generation budget the records were made with are the run's too: the same file
    read as 8-shot records (they are 2-shot) or with another budget would be logged, and its gate saved, as such."""
    for override, named in (("prompt.k_demos=8", "k_demos=2; this run has prompt.k_demos=8"),
                            ("llm.max_new_tokens=96", "max_new_tokens=6; this run has llm.max_new_tokens=96")):
        cfg = as_plain(compose_config(["llm=tiny_random", f"llm.records={published[1]}", f"dataset.path={FIXTURE}",
                                       "llm.max_new_tokens=6", "prompt.k_demos=2", override]))
        with pytest.raises(UserError, match=f"was written with {named}"):
            stage_of(cfg, Paths(root=PACKAGE_ROOT, cache=tmp_path)).output()


def _replay_stage(published, cache: Path, **llm) -> Any:
    """The stage of a run reading the published records file (no LLM loaded yet)."""
    cfg = tiny_cfg()
    return stage_of(cfg | {"llm": cfg["llm"] | {"records": str(published[1])} | llm}, Paths(root=PACKAGE_ROOT, cache=cache))


def test_hidden_states_replayed_for_a_records_file_equal_the_stages(published, tmp_path, monkeypatch):
    """One teacher-forced forward per call gives the states the stage captured while generating."""
    from mice_exp.llm import model
    from mice_exp.llm.replay import replay_activations

    out, path = published
    replayed = replay_activations(_replay_stage(published, tmp_path), read_records_file(path))
    for name in ("first_token", "last_token", "mean_pool"):
        captured = read_stage(out).arrays(name)
        assert replayed[name].shape == captured.shape
        # batched KV-cached decoding vs one pass: float rounding only
        np.testing.assert_allclose(replayed[name], captured, rtol=1e-4, atol=1e-4 * np.abs(captured).max())
    monkeypatch.setattr(model, "load_hf", lambda *a: pytest.fail("replayed states are cached"))
    again = replay_activations(_replay_stage(published, tmp_path), read_records_file(path))
    np.testing.assert_array_equal(again["mean_pool"], replayed["mean_pool"])


def test_a_hidden_state_probe_runs_on_a_records_file(published, tmp_path):
    from mice_exp.run import run

    out = run(compose_config(["llm=tiny_random", f"llm.records={published[1]}", "features=conf_only",
                              "estimator=probe_last", "tracking.enabled=false", "permutations=0", "gate.save=false",
                              f"paths.cache={tmp_path}", f"dataset.path={FIXTURE}", "llm.batch_size=2",
                              "llm.max_new_tokens=6", "prompt.k_demos=2"]))
    assert out["llm_examples"] == 6 and np.isfinite(out["objective"])
    assert list(tmp_path.glob("llm/tiny_random-records-*/activations-*/shard-*.npz"))


def test_states_are_replayed_only_by_the_llm_that_wrote_them_from_complete_records(published, tmp_path):
    from mice_exp.llm.replay import replay_activations

    with pytest.raises(UserError, match="written by tiny_random, not llm=smollm2_135m") as error:
        replay_activations(_replay_stage(published, tmp_path, name="smollm2_135m"), read_records_file(published[1]))
    assert "\n" not in str(error.value)
    stripped = read_records_file(published[1])
    for record in stripped.records:
        del record["token_ids"]
    with pytest.raises(UserError, match="6 records lack 'token_ids', which replaying their hidden states needs"):
        replay_activations(_replay_stage(published, tmp_path), stripped)


def test_the_published_records_reproduce_the_committed_table1_rows(tmp_path):
    """Raw confidence, HRE and NWKR of SmolLM2's Table 1 (experiments/table1/pool-all/results.csv, from the full
    LLM-stage sweep) come out of experiments/records/ again, with no LLM."""
    import pandas as pd

    from mice_exp.run import run
    from mice_exp.tracking.schema import baseline_key

    records = PACKAGE_ROOT / "experiments" / "records" / "ste-smollm2_135m-pool-all.jsonl.gz"
    table = pd.read_csv(PACKAGE_ROOT / "experiments" / "table1" / "pool-all" / "results.csv")
    rows = table[(table["table"] == "table1") & (table["llm"] == "smollm2_135m") & (table["source"] == "baseline")]
    assert set(rows["estimator"]) == {"raw", "hre", "nwkr"}
    out = run(compose_config(["llm=smollm2_135m", f"llm.records={records}", "prompt.demo_pool=all", "features=conf_only",
                              "estimator=mice_lr", "tracking.enabled=false", "permutations=0", "gate.save=false",
                              f"paths.cache={tmp_path}"]))
    assert out["llm_examples"] == 750
    for row in rows.itertuples():
        for metric in ("smece", "etcu_low", "etcu_medium", "etcu_high", "auc_etcu"):
            # the same records and estimators give the same predictions; 1e-9 absorbs summation order only
            assert abs(out[baseline_key(row.estimator, metric)] - getattr(row, metric)) < 1e-9, (row.row, metric)
