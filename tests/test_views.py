"""Feature views are scikit-learn transformers built from conf/features in one hop."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import skops.io as sio
from sklearn.base import clone

from mice_exp.compose import as_plain, compose_config
from mice_exp.errors import UserError
from mice_exp.features import build_features, make_view
from mice_exp.features.views import BertScoreView, FeatureView, MeanPoolView, PcaView
from mice_exp.llm.records import StageOutput
from mice_exp.needs import Needs
from mice_exp.paths import PACKAGE_ROOT


def stage(n: int = 20, layers: int = 4, d: int = 6, seed: int = 0) -> StageOutput:
    """Records and pooled states of a fake LLM stage: half train, half test."""
    rng = np.random.default_rng(seed)
    records = [{"id": f"api{i % 2}/{i}", "api": f"api{i % 2}", "split": "train" if i < n // 2 else "test",
                "label": i % 2, "raw_confidence": float(rng.random())} for i in range(n)]
    pooled = {"mean_pool": rng.normal(size=(n, layers, d))}
    return StageOutput(records=records, info={"n_layers": layers, "hidden_size": d}, key="fake", pooled=pooled)


@pytest.mark.parametrize("path", sorted((PACKAGE_ROOT / "conf" / "features").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_conf_features_entry_is_one_transformer(path):
    features = as_plain(compose_config([f"features={path.stem}"]))["features"]
    view = make_view(features)
    assert isinstance(view, FeatureView) and view.view == features["view"]
    assert clone(view).get_params() == view.get_params()  # only parameters in __init__


def test_the_pca_view_learns_from_the_training_rows_only():
    out = stage()
    train = np.array([r["split"] == "train" for r in out.records])
    view = PcaView(components=3).fit(out, rows=train)
    moved = StageOutput(**{**out.__dict__, "pooled": {"mean_pool": out.pooled["mean_pool"].copy()}})
    moved.pooled["mean_pool"][~train] += 100.0  # test rows change: the fitted projections must not
    refit = PcaView(components=3).fit(moved, rows=train)
    for a, b in zip(view.pcas_, refit.pcas_):
        np.testing.assert_array_equal(a.components_, b.components_)
    X = view.transform(out)
    assert X.shape == (20, 4 * 3 + 1) and list(view.get_feature_names_out())[-1] == "confidence"


def test_a_pca_view_refuses_to_shrink_below_its_name():
    """pca10 on 3 training rows cannot give 10 components: it refuses instead of quietly fitting 3."""
    with pytest.raises(UserError, match=r"features.components=10: the PCA view fits on 3 training rows of "
                                        r"6-dimensional states, which give at most 3 components"):
        PcaView(components=10).fit(stage(), rows=np.arange(20) < 3)
    assert PcaView(components=3).fit(stage(), rows=np.arange(20) < 3).pcas_[0].n_components_ == 3


def test_a_fitted_pca_view_round_trips_through_skops_with_only_its_own_class_to_trust():
    out = stage()
    view = PcaView(components=3, layers=[2, 4]).fit(out, rows=np.arange(20) < 10)
    data = sio.dumps(view)
    assert sio.get_untrusted_types(data=data) == ["mice_exp.features.views.PcaView"]
    loaded = sio.loads(data, trusted=["mice_exp.features.views.PcaView"])
    np.testing.assert_array_equal(loaded.transform(out), view.transform(out))


def test_a_gate_saved_before_views_had_targets_still_builds_its_view():
    saved = {"name": "cosine", "view": "cosine", "layers": "all", "confidence": True, "sources": []}
    fs = build_features(saved, stage(), None)
    assert fs.columns == ["cos_L1", "cos_L2", "cos_L3", "confidence"]


def test_a_view_label_that_is_not_its_class_is_one_line():
    features = as_plain(compose_config(["features=pca10"]))["features"] | {"view": "cosine"}
    with pytest.raises(UserError, match=r"features.view='cosine', but features._target_=mice_exp.features.views.PcaView "
                                        r"is the 'pca' features; expected features.view=pca"):
        make_view(features)


def test_a_view_says_what_it_reads_so_the_config_check_can_refuse_what_is_missing():
    assert BertScoreView(sources=["p_true"]).needs() == Needs.of(sources=["p_true"], record_fields=["layer_strings"])
    assert MeanPoolView().needs() == Needs.of(arrays=["mean_pool"])
    assert MeanPoolView(layers="none").needs() == Needs()  # conf_only-like: no layer is read



def test_a_gates_bertscore_view_scores_a_batch_of_queries_once(monkeypatch, tmp_path):
    """A gate's view keeps no cache: BERTScore (the costly part of its features) runs once per batch, and the
    per-layer scores that only a run's figures use are left out; a run's view reads them back from its cache."""
    from mice_exp.features import bertscore, transform_features

    calls = []

    def fake_matrix(records, encoder):
        calls.append(len(records))
        return np.linspace(0.1, 0.9, len(records) * 3).reshape(len(records), 3)

    monkeypatch.setattr(bertscore, "bertscore_matrix", fake_matrix)
    out = stage(layers=4)
    fs = transform_features(BertScoreView().fit(out), out)  # cache_dir None, as a gate sets it
    assert calls == [20] and fs.X.shape == (20, 4) and fs.layer_scores is None
    calls.clear()
    fs = transform_features(BertScoreView(cache_dir=tmp_path).fit(out), out)
    assert calls == [20] and fs.layer_scores.shape == (20, 3)
    np.testing.assert_array_equal(fs.layer_scores, fs.X[:, :3])


def test_the_bertscore_encoder_is_loaded_once_per_process(monkeypatch):
    """A gate's server computes BERTScores for every request: the encoder loads on the first, not on each."""
    import bert_score

    from mice_exp.features import bertscore

    loads = []
    monkeypatch.setattr(bert_score, "BERTScorer", lambda **kw: loads.append(kw) or type("S", (), {"_tokenizer": None})())
    bertscore._scorer.cache_clear()
    try:
        encoder = {"model": "an/encoder", "num_layers": 6}
        first = bertscore.make_scorer(encoder)
        assert bertscore.make_scorer(dict(encoder)) is first and len(loads) == 1
        assert bertscore.make_scorer(encoder | {"num_layers": 5}) is not first and len(loads) == 2
    finally:
        bertscore._scorer.cache_clear()


BERTSCORE_IN_A_FRESH_PROCESS = """
import gzip, hashlib, json
from mice_exp.features.bertscore import bertscore_matrix
with gzip.open("experiments/records/ste-gemma3_270m.jsonl.gz", "rt") as handle:
    calls = [r for r in map(json.loads, handle) if "layer_strings" in r][:32]
print(hashlib.sha256(bertscore_matrix(calls, {"num_layers": 6, "batch_size": 64}).tobytes()).hexdigest())
"""


def test_bertscores_are_the_same_bits_whatever_the_process_s_hash_seed():
    """bert-score orders ties among a call's sentences by a set's (hash-seeded) order; the batches, and so the
    scores' last bits, moved with it from run to run (enough to move a random forest's Table 1 cells)."""
    digests = {subprocess.run([sys.executable, "-c", BERTSCORE_IN_A_FRESH_PROCESS], cwd=PACKAGE_ROOT, check=True,
                              capture_output=True, text=True,
                              env=os.environ | {"PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"}).stdout.split()[-1]
               for seed in ("1", "2")}
    assert len(digests) == 1


#: The substrings bert-score tests in the path it is handed (``"t5" in model_type``, ``startswith("scibert")``,
#: ``"uncased" in``), and the names of the families it knows (``model2layers``).
PATH_WORDS = ("t5", "scibert", "uncased", "gpt2", "xlnet", "xlm", "roberta", "bart", "deberta")


def test_no_folder_name_chooses_the_bertscore_encoder(tmp_path):
    """The encoder under folders named after each of bert-score's substrings scores the suite's calls bit for bit as
    the packaged one (its class comes from its config); under ``t5/`` bert-score loaded a random T5 encoder."""
    import gzip
    import json

    from mice_exp.features.bertscore import bertscore_matrix
    from mice_exp.packages import default_model_path

    with gzip.open(PACKAGE_ROOT / "experiments" / "records" / "ste-smollm2_135m.jsonl.gz", "rt") as handle:
        calls = [r for r in map(json.loads, handle) if "layer_strings" in r][:4]
    plain = bertscore_matrix(calls, {"num_layers": 6, "batch_size": 64})
    for word in PATH_WORDS:
        folder = tmp_path / word / f"{word}-encoder"
        folder.parent.mkdir()
        folder.symlink_to(default_model_path(), target_is_directory=True)
        scores = bertscore_matrix(calls, {"model": str(folder), "num_layers": 6, "batch_size": 64})
        assert scores.tobytes() == plain.tobytes(), word


def test_an_encoder_with_a_missing_weight_is_refused_in_one_line(tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from mice_exp.data.retrieval import SentenceEncoder
    from mice_exp.features.bertscore import bertscore_matrix
    from mice_exp.packages import default_model_path

    source = default_model_path()
    shutil.copytree(source, tmp_path / "enc")
    weights = load_file(str(tmp_path / "enc" / "model.safetensors"))
    del weights[next(k for k in weights if "encoder.layer.0.attention.self.query.weight" in k)]
    save_file(weights, str(tmp_path / "enc" / "model.safetensors"))
    for load in (lambda: bertscore_matrix([{"layer_strings": ["a"], "text": "a"}],
                                          {"model": str(tmp_path / "enc"), "num_layers": 6}),
                 lambda: SentenceEncoder(tmp_path / "enc")):
        with pytest.raises(UserError, match=r"loaded with weights 1 missing \(e.g. '.*encoder.layer.0.attention.self"
                                            r".query.weight'\); expected a checkpoint holding every weight") as info:
            load()
        assert "\n" not in str(info.value)


def test_many_agents_judged_calls_score_each_distinct_call_once(tmp_path, monkeypatch):
    """Two agents' records sharing a call: warming their caches scores three distinct calls, and each file's
    BERTScores are those of scoring it alone (up to the padding of other batches: 1e-6)."""
    import gzip
    import json

    from mice_exp.features import bertscore

    with gzip.open(PACKAGE_ROOT / "experiments" / "records" / "ste-smollm2_135m.jsonl.gz", "rt") as handle:
        a, b, c = [r for r in map(json.loads, handle) if "layer_strings" in r][:3]
    first = StageOutput(records=[a, b], info={}, key="first")
    second = StageOutput(records=[b, c], info={}, key="second")
    encoder = {"num_layers": 6, "batch_size": 64}
    assert bertscore.warm_bertscores([first, second], tmp_path, encoder) == 3
    monkeypatch.setattr(bertscore, "bertscore_matrix", lambda *a, **k: pytest.fail("the caches are warm"))
    warm = [bertscore.cached_bertscore(s, tmp_path, encoder) for s in (first, second)]
    monkeypatch.undo()
    for stage, scores in zip((first, second), warm):
        np.testing.assert_allclose(scores, bertscore.bertscore_matrix(stage.records, encoder), atol=1e-6)
