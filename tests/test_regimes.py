"""Hidden miscalibration regimes: field recovery, audits, local correction, plumbing.

Fits here are cut down from the paper's budget (one grid point, tens of epochs, one torch
thread) so the file stays within a few minutes on a 2-core CPU; benchmarks/regimes_synthetic.py
measures the full-size, full-grid figures.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from mice_exp.errors import UserError
from mice_exp.estimators.field import regime_predictions
from mice_exp.regimes import (
    MiscalibrationField,
    Triples,
    diagnose,
    permutation_null,
    preset,
    range_aware_correction,
    regime_metrics,
    seed_stability,
    sinusoidal,
    three_clusters,
)
from mice_exp.regimes.kernel import leave_one_out, smooth_against_bank
from mice_exp.regimes.objective import discovery_loss
from mice_exp.regimes.representation import Phi
from mice_exp.report.figures import region_reliability

QUIET = {"progress": False, "num_threads": 1}
#: Clusters are recovered from phi's first epochs at the paper's learning rate.
CLUSTER_FIT = {"sigmas": (0.2,), "lambdas": (1e-3,), "max_epochs": 15, "patience": 5, **QUIET}
#: A short run needs a larger step than the paper's 3e-5 for phi to move at all.
SHORT_FIT = {"sigmas": (0.3,), "lambdas": (1e-3,), "lr": 1e-3, "max_epochs": 10, "patience": 5, **QUIET}


def fit(model: MiscalibrationField, train: Triples, val: Triples) -> MiscalibrationField:
    return model.fit(train.x, train.f, train.y, val.x, val.f, val.y)


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


@pytest.fixture(scope="module")
def clusters():
    return three_clusters(n=4000, seed=0)


@pytest.fixture(scope="module")
def cluster_model(clusters):
    return fit(MiscalibrationField(**CLUSTER_FIT), clusters.train, clusters.val)


# --------------------------------------------------------------------------- recovery


def test_three_cluster_field_is_recovered(clusters, cluster_model):
    assert pearson(cluster_model.field(clusters.test.x), clusters.true_field["test"]) >= 0.9


def test_sinusoidal_field_is_recovered():
    data = sinusoidal(n=10_000, seed=0, amplitude=0.6, frequency=3)
    settings = {**SHORT_FIT, "lambdas": (1e-4,), "lr": 3e-3, "max_epochs": 30, "patience": 20}
    model = fit(MiscalibrationField(**settings), data.train, data.val)
    assert pearson(model.field(data.test.x), data.true_field["test"]) >= 0.8


def test_three_clusters_hide_their_errors_from_the_global_reliability_diagram():
    """The generator's point: opposite cluster errors mostly cancel when binned by confidence."""
    data = three_clusters(n=10_000, seed=0)
    metrics = regime_metrics(data.true_field["test"], data.test.y, {"base": data.test.f})
    assert metrics["smece_all_base"] < min(metrics["smece_over_base"], metrics["smece_under_base"]) / 3


# --------------------------------------------------------------------------- diagnostics


def test_discovered_regimes_are_worse_calibrated_and_the_field_corrects_them(clusters, cluster_model):
    test = clusters.test
    predictions = regime_predictions(cluster_model, clusters.train, test)
    result = diagnose(cluster_model.field(test.x), test.y, predictions)
    m = result.metrics
    assert m["worst_slice_gap"] > 0.05
    for region in ("over", "under"):
        assert m[f"smece_{region}_field"] < m[f"smece_{region}_base"] * 2 / 3
        assert m[f"smece_{region}_field"] < min(m[f"smece_{region}_iso"], m[f"smece_{region}_ts"])
    assert all(isinstance(v, float) for v in m.values())
    assert {"all", "over", "under"} <= set(result.regions)
    assert all(result.regions[r].sum() >= 30 for r in result.regions)
    figures = region_reliability(test.f, test.y, result.regions, num_bootstrap=10)
    assert set(figures) == set(result.regions)
    assert figures["over"].axes[0].get_title().startswith(f"over (n={result.regions['over'].sum()},")


def test_regions_smaller_than_min_region_count_as_not_found():
    delta = np.r_[np.full(5, -0.2), np.zeros(95)]
    f = np.full(100, 0.5)
    y = (np.arange(100) % 2).astype(float)
    metrics = regime_metrics(delta, y, {"base": f}, min_region=10)
    assert np.isnan(metrics["smece_over_base"]) and metrics["frac_over"] == 0.05
    assert metrics["worst_slice_gap"] == 0.0


# --------------------------------------------------------------------------- audits


def test_permutation_null_finds_no_hidden_regime_on_structureless_data():
    data = sinusoidal(n=4000, seed=0, amplitude=0.0)  # y ~ Bernoulli(f): calibrated everywhere
    audit = permutation_null(MiscalibrationField(**SHORT_FIT), data.train, data.val, data.test, n_permutations=3)
    assert len(audit.runs) == 3
    assert abs(audit.summary["worst_slice_gap_mean"]) < 0.03


def test_seeds_agree_on_the_cluster_field(clusters):
    estimator = MiscalibrationField(**CLUSTER_FIT)
    audit = seed_stability(estimator, clusters.train, clusters.val, clusters.test, seeds=(0, 1))
    assert audit.summary["field_corr_mean"] > 0.9
    assert audit.summary["sign_agreement_mean"] > 0.8


# --------------------------------------------------------------------------- local correction


@given(
    f=st.floats(0.0, 1.0),
    delta=st.floats(-2.0, 2.0),
    alpha=st.floats(0.0, 1e6),
)
def test_correction_stays_in_unit_interval_and_follows_the_field_sign(f, delta, alpha):
    corrected = float(range_aware_correction(np.array([f]), np.array([delta]), alpha)[0])
    assert 0.0 <= corrected <= 1.0
    assert (corrected - f) * delta >= 0.0 or abs(corrected - f) < 1e-12


def test_correction_does_not_worsen_brier_without_structure():
    """Pooled over three structureless data sets, the Brier increase stays within 3 paired SEs."""
    differences = []
    for seed in range(3):
        data = sinusoidal(n=10_000, seed=seed, amplitude=0.0)
        model = fit(MiscalibrationField(**SHORT_FIT), data.train, data.val)
        test = data.test
        corrected = model.correct(test.x, test.f)
        differences.append((test.y - corrected) ** 2 - (test.y - test.f) ** 2)
    d = np.concatenate(differences)
    assert d.mean() <= 3 * d.std() / np.sqrt(len(d))


# --------------------------------------------------------------------------- estimator plumbing


def test_training_estimate_leaves_out_the_points_own_residual():
    z = torch.tensor([[0.0, 0.0], [0.0, 0.0], [10.0, 0.0]])
    residual = torch.tensor([1.0, -1.0, 0.5])
    smoothed = leave_one_out(z, residual, sigma=1.0)
    assert smoothed.delta[0] == pytest.approx(-1.0)  # only its twin's residual
    assert smoothed.mass[0] == pytest.approx(1.0, abs=1e-6)  # self weight of 1 excluded


def test_mass_penalty_pulls_sparse_neighbourhoods_together():
    """Eq. 4's hinge must carry a gradient: with zero residuals only lambda's term acts, and one
    descent step on the embeddings raises every neighbourhood mass that is below m_min."""
    z = torch.linspace(0.0, 3.0, 8)[:, None] * torch.tensor([[1.0, 0.0]])
    for lam, moves in ((0.0, False), (1e-2, True)):
        z_step = z.clone().requires_grad_(True)
        loss = discovery_loss(leave_one_out(z_step, torch.zeros(8), sigma=0.5), lam, m_min=20.0)
        loss.backward()
        before = leave_one_out(z, torch.zeros(8), sigma=0.5).mass
        after = leave_one_out(z - 0.1 * z_step.grad, torch.zeros(8), sigma=0.5).mass
        assert bool(torch.all(after > before)) is moves


def test_dropout_scatters_training_embeddings_beyond_small_bandwidths():
    """Why lambda barely acts under the paper's dropout 0.1 on 2-d inputs: in training mode each
    embedding moves by more than sigma = 0.1, so in-batch neighbourhoods are empty and the hinge
    sits in the kernel's flat tail; without dropout the same batch has neighbours."""
    torch.manual_seed(0)
    x = torch.rand(1000, 2) * 3.4 - 1.7  # a standardised unit square
    phi = Phi(2, 256, 2, 64, dropout=0.1)
    with torch.no_grad():
        train_mass = leave_one_out(phi.train()(x), torch.zeros(1000), sigma=0.1).mass
        eval_mass = leave_one_out(phi.eval()(x), torch.zeros(1000), sigma=0.1).mass
    assert train_mass.median() < 0.5 < 3.0 < eval_mass.median()


def test_chunked_bank_smoothing_matches_equation_2():
    gen = torch.Generator().manual_seed(0)
    queries, bank = torch.randn(50, 3, generator=gen), torch.randn(200, 3, generator=gen)
    residual = torch.randn(200, generator=gen)
    kernel = torch.exp(-torch.cdist(queries, bank) ** 2 / 1.5**2)
    chunked = smooth_against_bank(queries, bank, residual, sigma=1.5, chunk_size=7)
    torch.testing.assert_close(chunked.delta, kernel @ residual / kernel.sum(1))
    torch.testing.assert_close(chunked.mass, kernel.sum(1))


def test_fit_is_deterministic_and_survives_a_pickle_free_round_trip(clusters, tmp_path):
    settings = {**CLUSTER_FIT, "max_epochs": 3}
    first = fit(MiscalibrationField(**settings), clusters.train, clusters.val)
    second = fit(MiscalibrationField(**settings), clusters.train, clusters.val)
    np.testing.assert_array_equal(first.field(clusters.test.x), second.field(clusters.test.x))

    save_file(first.state_dict(), tmp_path / "field.safetensors")
    (tmp_path / "field.json").write_text(json.dumps(first.metadata()))
    loaded = MiscalibrationField.from_state(
        load_file(tmp_path / "field.safetensors"), json.loads((tmp_path / "field.json").read_text())
    )
    x, f = clusters.test.x, clusters.test.f
    np.testing.assert_array_equal(loaded.correct(x, f), first.correct(x, f))


def test_fit_records_the_grid_and_selects_its_best_validation_proxy(clusters):
    settings = {**CLUSTER_FIT, "sigmas": (0.05, 0.2), "max_epochs": 2}
    model = fit(MiscalibrationField(**settings), clusters.train, clusters.val)
    assert [(h["sigma"], h["lambda"]) for h in model.history_] == [(0.05, 1e-3), (0.2, 1e-3)]
    best = min(model.history_, key=lambda h: h["val_proxy"])
    assert (model.sigma_, model.val_proxy_) == (best["sigma"], best["val_proxy"])
    assert np.all(model.mass(clusters.test.x) > 0)


def test_bank_is_capped_by_uniform_sampling(clusters):
    model = fit(MiscalibrationField(**{**CLUSTER_FIT, "bank_size": 500, "max_epochs": 1}), clusters.train, clusters.val)
    assert model.state_dict()["bank_z"].shape == (500, model.config.d_out)


def test_presets_follow_the_paper_network_sizes():
    assert (preset("synthetic").config.hidden, preset("synthetic").config.d_out) == (256, 64)
    assert (preset("llm").config.hidden, preset("llm").config.d_out) == (512, 128)
    with pytest.raises(UserError, match="unknown preset"):
        preset("vision")


@pytest.mark.parametrize(
    ("f", "y", "message"),
    [([0.2, 1.3], [0, 1], r"\[0, 1\]"), ([0.2, 0.3], [0, 2], "0 or 1"), ([0.2], [0, 1], "lengths differ")],
)
def test_bad_triples_are_user_errors(f, y, message):
    with pytest.raises(UserError, match=message):
        Triples(np.zeros((len(f), 2)), f, y)


def test_field_before_fit_is_a_user_error():
    with pytest.raises(UserError, match="not fitted"):
        MiscalibrationField().field(np.zeros((3, 2)))
