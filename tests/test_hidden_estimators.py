"""Hidden-state baselines: linear probes and the Mahalanobis distance, on tiny synthetic states."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

from mice_exp.errors import UserError
from mice_exp.estimators import BestLayerProbe, LinearProbe, MahalanobisConfidence
from mice_exp.estimators.blocks import layers
from mice_exp.features import FeatureSet
from mice_exp.protocols import holdout


def states(n: int = 80, n_layers: int = 3, d: int = 4, signal_layer: int = 3, seed: int = 0):
    """X [N, L * d] with columns named by layer, where only ``signal_layer`` (1-based) separates correct
    from incorrect calls."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    H = rng.normal(size=(n, n_layers, d))
    H[:, signal_layer - 1, 0] += np.where(y == 1, 3.0, -3.0)  # 6 standard deviations apart: separable
    return layers(H), y


def test_a_probe_separates_linearly_separable_final_states() -> None:
    X, y = states()
    X_test, y_test = states(seed=1)
    probe = LinearProbe().fit(X, y)
    p = probe.predict_proba(X_test)[:, 1]
    assert probe.n_layers_ == 3
    assert (p[y_test == 1] > 0.5).all() and (p[y_test == 0] < 0.5).all()


def test_a_probe_on_a_layer_without_signal_does_no_better_than_chance() -> None:
    X, y = states(signal_layer=2)
    X_test, y_test = states(signal_layer=2, seed=1)
    accuracy = (LinearProbe().fit(X, y).predict(X_test) == y_test).mean()
    assert accuracy < 0.75  # the final layer is noise; 80 calls put chance at 0.5 +- 0.06


def test_the_best_layer_is_found_by_cross_validation_on_the_training_rows() -> None:
    X, y = states(signal_layer=2)
    probe = BestLayerProbe(cv=4).fit(X, y)
    assert probe.layer_ == 2 and probe.cv_scores_.shape == (3,)
    assert np.argmax(probe.cv_scores_) == 1
    p = probe.predict_proba(states(signal_layer=2, seed=1)[0])[:, 1]
    assert ((p > 0.5) == (states(signal_layer=2, seed=1)[1] == 1)).all()


def test_mahalanobis_confidence_is_a_probability_ordered_by_the_distance_difference() -> None:
    X, y = states()
    model = MahalanobisConfidence().fit(X, y)
    X_test = states(seed=1)[0]
    p = model.predict_proba(X_test)[:, 1]
    assert ((p >= 0) & (p <= 1)).all()
    d = model.distances(X_test)
    order = np.argsort(d[:, 0] - d[:, 1])  # from nearest the incorrect mean to nearest the correct one
    assert (np.diff(p[order]) >= 0).all()
    assert p[d[:, 1] < d[:, 0]].min() > p[d[:, 1] > d[:, 0]].max()


def test_fixed_shrinkage_and_clone_keep_the_parameters() -> None:
    model = MahalanobisConfidence(shrinkage=0.5, cv=3)
    assert clone(model).get_params() == model.get_params()
    X, y = states()
    assert clone(model).fit(X, y).geometry_.precision.shape == (4, 4)


def test_a_layer_outside_the_states_is_named() -> None:
    X, y = states()
    with pytest.raises(ValueError, match=r"layer=7; expected 1..3"):
        LinearProbe(layer=7).fit(X, y)


def test_states_without_layer_names_are_one_layer() -> None:
    X, y = states(n_layers=1, signal_layer=1)
    plain = LinearProbe().fit(X.to_numpy(), y)
    assert plain.n_layers_ == 1
    np.testing.assert_array_equal(plain.predict_proba(X.to_numpy()), LinearProbe().fit(X, y).predict_proba(X))


def test_layer_blocks_of_unequal_width_are_refused() -> None:
    X, y = states()
    with pytest.raises(ValueError, match="are not layers 1..L of one width"):
        LinearProbe().fit(X.drop(columns="layer2__3"), y)


def feature_set(llm_dir) -> FeatureSet:
    """Six rows whose LLM-stage output is the cache folder ``llm_dir`` (None: no LLM-stage output)."""
    from mice_exp.llm.records import read_stage

    n = 6
    return FeatureSet(ids=[str(i) for i in range(n)], apis=np.array(["a"] * n), splits=np.array(["train"] * 4 + ["test"] * 2),
                      labels=np.array([0, 1] * 3), confidence=np.full(n, 0.5), X=np.zeros((n, 1)), columns=["c"],
                      layer_scores=None, stage=read_stage(llm_dir) if llm_dir else None)


def test_the_protocol_hands_a_probe_every_layer_of_its_representation(tmp_path) -> None:
    from mice_exp.cache import write_jsonl, write_npz

    X, y = states(n=6)
    write_jsonl(tmp_path / "shard-00000.jsonl", [{"id": str(i)} for i in range(6)])
    write_npz(tmp_path / "shard-00000.npz", {"last_token": X.to_numpy().reshape(6, 3, 4).astype(np.float32)})
    probe = LinearProbe()
    X = probe.design(feature_set(tmp_path))
    assert X.shape == (6, 12) and list(X.columns[[0, 4, 11]]) == ["layer1__0", "layer2__0", "layer3__3"]
    p, fitted = holdout(probe, feature_set(tmp_path))
    assert p.shape == (2,) and fitted.n_layers_ == 3
    assert probe.get_params() == LinearProbe().get_params() and not hasattr(probe, "n_layers_")  # the caller's, untouched


@pytest.mark.parametrize("make_dir", [lambda tmp: None, lambda tmp: tmp], ids=["no cache", "no arrays"])
def test_a_cache_without_hidden_states_is_one_user_error_line(tmp_path, make_dir) -> None:
    with pytest.raises(UserError, match="hidden states") as error:
        LinearProbe().design(feature_set(make_dir(tmp_path)))
    assert "\n" not in str(error.value)
