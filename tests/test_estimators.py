"""Confidence estimators as a pipeline uses them: built from config, fitted, cloned, asked for p."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import relplot
from hydra.utils import instantiate
from omegaconf import OmegaConf
from scipy.special import expit, logit
from scipy.stats import norm
from sklearn.base import clone
from sklearn.ensemble import RandomForestClassifier

from mice_exp.estimators import (
    BestLayerProbe,
    ConfidenceEstimator,
    FallbackWarning,
    FieldCorrection,
    HistogramRegression,
    IsotonicCalibration,
    KernelRegression,
    LinearProbe,
    MahalanobisConfidence,
    MiceLogisticRegression,
    MiceRandomForest,
    PlattScaling,
    RawConfidence,
    TemperatureScaling,
)
from mice_exp.estimators.blocks import side_by_side
from mice_exp.estimators.inputs import BaseAndRepresentation, OneConfidence
from mice_exp.needs import Needs

ESTIMATOR_CONF = Path(__file__).resolve().parents[1] / "conf" / "estimator"

# Small enough for the whole suite to stay fast; the paper's 1000 trees are tested on their own.
SMALL = [
    RawConfidence(),
    HistogramRegression(),
    KernelRegression(),
    PlattScaling(),
    IsotonicCalibration(),
    TemperatureScaling(),
    MiceLogisticRegression(),
    MiceRandomForest(n_estimators=20),
    FieldCorrection(RawConfidence(), field={"max_epochs": 2, "sigmas": [0.3], "lambdas": [0.01]}),
    # hidden-state estimators read toy_data's six unnamed columns as one layer's state
    LinearProbe(),
    BestLayerProbe(),
    MahalanobisConfidence(),
]
LEARNERS = [estimator for estimator in SMALL if estimator.learns]


def ids(estimator: ConfidenceEstimator) -> str:
    return type(estimator).__name__


def toy_data(n: int = 120, n_features: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A feature view whose last column is the raw confidence, and labels that follow it."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, n_features))
    y = (rng.random(n) < X[:, -1]).astype(int)
    return X, y


def view(estimator: ConfidenceEstimator, X: np.ndarray):
    """What the estimator reads of toy_data: the raw confidence, every column, or (a field correction)
    its base's raw confidence beside the other columns as a representation."""
    if isinstance(estimator.reads, BaseAndRepresentation):
        return side_by_side({"base": X[:, -1:], "representation": X[:, :-1]})
    return X[:, -1:] if isinstance(estimator.reads, OneConfidence) else X


# --- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(ESTIMATOR_CONF.glob("*.yaml")), ids=lambda path: path.stem)
def test_each_config_builds_its_estimator_with_the_class_defaults(path: Path) -> None:
    cfg = OmegaConf.create({"seed": 0, "estimator": OmegaConf.load(path)}).estimator  # as composed
    estimator = instantiate(cfg.model)
    assert isinstance(estimator, ConfidenceEstimator)
    assert isinstance(cfg.name, str) and cfg.name
    configured = {key: value for key, value in cfg.model.items() if key != "_target_"}
    defaults = type(estimator)().get_params()
    assert {key: defaults[key] for key in configured} == configured, "config and code disagree"


def test_every_estimator_has_a_config() -> None:
    targets = {OmegaConf.load(path).model._target_ for path in ESTIMATOR_CONF.glob("*.yaml")}
    assert targets == {f"mice_exp.estimators.{ids(estimator)}" for estimator in SMALL}


def test_estimators_say_what_they_read_beyond_the_feature_view() -> None:
    assert RawConfidence().needs() == Needs()  # the raw confidence comes with every record
    assert RawConfidence().needs("p_true") == Needs.of(sources=["p_true"])  # estimator=p_true (source: p_true)
    assert MiceRandomForest().needs("p_true") == Needs()  # it reads the view, which declares its own sources
    assert LinearProbe(representation="mean_pool").needs() == Needs.of(arrays=["mean_pool"])
    field = FieldCorrection(PlattScaling())  # representation: first_token
    assert field.needs("verbalized") == Needs.of(sources=["verbalized"], arrays=["first_token"])
    assert FieldCorrection(MiceLogisticRegression(), representation="features").needs() == Needs()


# --- the sklearn contract -----------------------------------------------------------------


@pytest.mark.parametrize("estimator", SMALL, ids=ids)
def test_fit_predict_proba_and_clone(estimator: ConfidenceEstimator) -> None:
    X, y = toy_data()
    fitted = clone(estimator).fit(view(estimator, X), y)
    proba = fitted.predict_proba(view(estimator, X))
    assert proba.shape == (len(y), 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert np.all((proba >= 0) & (proba <= 1))
    np.testing.assert_array_equal(fitted.predict(view(estimator, X)), proba[:, 1] > 0.5)

    refitted = clone(fitted)
    assert repr(refitted.get_params()) == repr(fitted.get_params())  # repr: a nested base is a new object
    assert not hasattr(refitted, "base_rate_"), "clone must drop learned state"
    np.testing.assert_array_equal(refitted.fit(view(estimator, X), y).predict_proba(view(estimator, X)), proba)


@pytest.mark.parametrize(
    "estimator", [e for e in SMALL if isinstance(e.reads, OneConfidence)], ids=ids
)
def test_confidence_estimators_take_one_column_in_the_unit_interval(
    estimator: ConfidenceEstimator,
) -> None:
    X, y = toy_data()
    with pytest.raises(ValueError, match="single column"):
        clone(estimator).fit(X, y)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        clone(estimator).fit(X[:, -1:] + 1, y)


# --- the shared guard ---------------------------------------------------------------------


@pytest.mark.parametrize("estimator", LEARNERS, ids=ids)
def test_a_single_class_warns_and_predicts_the_base_rate(estimator: ConfidenceEstimator) -> None:
    X, _ = toy_data(n=30)
    with pytest.warns(FallbackWarning, match="all 1"):
        fitted = clone(estimator).fit(view(estimator, X), np.ones(30, dtype=int))
    np.testing.assert_array_equal(fitted.predict_proba(view(estimator, X))[:, 1], 1.0)


@pytest.mark.parametrize("estimator", LEARNERS, ids=ids)
def test_nan_features_warn_and_predict_the_base_rate(estimator: ConfidenceEstimator) -> None:
    X, y = toy_data(n=40)
    X[3, -1] = np.nan
    X[5, -1] = np.inf
    with pytest.warns(FallbackWarning, match="NaN or inf"):
        fitted = clone(estimator).fit(view(estimator, X), y)
    clean = toy_data(n=10, seed=1)[0]
    np.testing.assert_allclose(fitted.predict_proba(view(estimator, clean))[:, 1], y.mean())


@pytest.mark.parametrize("estimator", SMALL, ids=ids)
def test_rows_with_nan_at_prediction_get_the_base_rate(estimator: ConfidenceEstimator) -> None:
    X, y = toy_data()
    fitted = clone(estimator).fit(view(estimator, X), y)
    test = toy_data(n=5, seed=2)[0]
    expected = fitted.predict_proba(view(estimator, test))[:, 1]
    test[2, -1], expected[2] = np.nan, y.mean()  # the raw confidence, which every estimator reads
    test = view(estimator, test)
    with pytest.warns(FallbackWarning, match="1 rows"):
        # The field's float32 network rounds differently for a 4-row than a 5-row batch and per CPU /
        # thread layout (relative 6e-6 seen); rtol 1e-4 is far below any base-rate mix-up (>1e-2).
        np.testing.assert_allclose(fitted.predict_proba(test)[:, 1], expected, rtol=1e-4)


def test_raw_confidence_learns_nothing_so_one_class_changes_nothing() -> None:
    confidence = np.array([[0.2], [0.9], [0.55]])
    fitted = RawConfidence().fit(confidence, [1, 1, 1])
    np.testing.assert_array_equal(fitted.predict_proba(confidence)[:, 1], confidence[:, 0])


# --- HRE ----------------------------------------------------------------------------------


def test_histogram_bins_values_on_an_edge_into_the_upper_bin() -> None:
    confidence = [0.0, 0.03, 0.04, 0.07, 0.079, 0.5, 0.96, 0.99, 1.0, 1.0]
    correct = [0, 0, 1, 1, 0, 1, 1, 0, 1, 1]  # base rate 0.6
    hre = HistogramRegression().fit(np.reshape(confidence, (-1, 1)), correct)
    # bin 0 [0, 0.04): 0/2; bin 1 [0.04, 0.08): 2/3; bin 12: 1/1; bin 24 [0.96, 1.0]: 3/4
    queries = [0.04, 0.0399, 0.079, 0.5, 0.96, 0.9599, 1.0, 0.3]
    expected = [2 / 3, 0.0, 2 / 3, 1.0, 0.75, 0.6, 0.75, 0.6]  # 0.9599 and 0.3 fall in empty bins
    np.testing.assert_allclose(hre.predict_proba(np.reshape(queries, (-1, 1)))[:, 1], expected)


# --- NWKR ---------------------------------------------------------------------------------


def skewed_confidences(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    f = rng.beta(2, 1.5, n)
    return f, (rng.random(n) < f**1.5).astype(int)


def test_kernel_regression_draws_relplots_reliability_curve() -> None:
    f, y = skewed_confidences(300, seed=0)
    nwkr = KernelRegression().fit(f[:, None], y)
    diagram = relplot.prepare_rel_diagram(f, y, plot_confidence_band=False, report_CE_std=False)
    assert nwkr.sigma_ == diagram["sigma"] == relplot.smECE(f, y, return_width=True)[1]
    np.testing.assert_allclose(nwkr.predict_proba(diagram["mesh"][:, None])[:, 1], diagram["mu"])


def test_kernel_regression_is_the_reflected_gaussian_nadaraya_watson_mean() -> None:
    f, y = skewed_confidences(300, seed=1)
    nwkr = KernelRegression().fit(f[:, None], y)
    # Closed form at the training points, with the kernel mirrored at 0 and at 1.
    distance = f[:, None] - f[None, :]
    mirrored = f[:, None] + f[None, :]
    weights = sum(
        norm.pdf(d / nwkr.sigma_) for d in (distance, mirrored, mirrored - 2)
    )
    np.testing.assert_allclose(
        nwkr.predict_proba(f[:, None])[:, 1], weights @ y / weights.sum(axis=1), atol=1e-3
    )


# --- recalibrators ------------------------------------------------------------------------


def test_temperature_scaling_recovers_the_temperature_that_made_the_labels() -> None:
    rng = np.random.default_rng(0)
    confidence = rng.uniform(0.01, 0.99, 20_000)
    y = (rng.random(confidence.size) < expit(logit(confidence) / 2.5)).astype(int)
    assert TemperatureScaling().fit(confidence[:, None], y).temperature_ == pytest.approx(2.5, rel=0.05)


def test_platt_scaling_undoes_a_monotone_distortion_of_the_logit() -> None:
    rng = np.random.default_rng(1)
    confidence = rng.uniform(0.01, 0.99, 20_000)
    truth = expit(0.5 * logit(confidence) - 1.0)
    y = (rng.random(confidence.size) < truth).astype(int)
    platt = PlattScaling().fit(confidence[:, None], y)
    np.testing.assert_allclose(platt.predict_proba(confidence[:, None])[:, 1], truth, atol=0.02)


def test_isotonic_calibration_is_monotone_and_clips_outside_the_training_range() -> None:
    X, y = toy_data(n=200)
    iso = IsotonicCalibration().fit(X[:, -1:] * 0.5 + 0.25, y)  # trained on [0.25, 0.75]
    predicted = iso.predict_proba(np.linspace(0, 1, 50)[:, None])[:, 1]
    assert np.all(np.diff(predicted) >= 0)
    assert predicted[0] == iso.predict_proba([[0.25]])[0, 1]
    assert predicted[-1] == iso.predict_proba([[0.75]])[0, 1]


# --- MICE ---------------------------------------------------------------------------------


def test_mice_random_forest_uses_the_paper_settings_and_defaults_otherwise() -> None:
    X, y = toy_data(n=40, n_features=12)
    forest = MiceRandomForest(seed=3).fit(X, y).model_.get_params()
    paper = dict(n_estimators=1000, max_depth=20, max_features=10, random_state=3, n_jobs=-1)
    assert forest == {**RandomForestClassifier().get_params(), **paper}


def test_mice_random_forest_caps_max_features_at_the_number_of_features() -> None:
    X, y = toy_data(n=40, n_features=3)
    assert MiceRandomForest(n_estimators=5).fit(X, y).model_.max_features == 3


def test_a_mice_random_forest_saves_as_a_few_arrays_and_comes_back_bit_for_bit() -> None:
    """skops and pickle see the fitted forest as arrays, not 1000 tree objects (a gate writes it in
    0.2 s instead of 2 s); what comes back predicts exactly what was saved."""
    import pickle
    import zipfile

    import skops.io as sio

    X, y = toy_data(n=200, n_features=12)
    forest = MiceRandomForest(n_estimators=50, n_jobs=1).fit(X, y)
    data = sio.dumps(forest, compression=zipfile.ZIP_DEFLATED)
    assert sio.get_untrusted_types(data=data) == ["mice_exp.estimators.mice.MiceRandomForest"]  # no tree objects
    for back in (sio.loads(data, trusted=["mice_exp.estimators.mice.MiceRandomForest"]),
                 pickle.loads(pickle.dumps(forest))):
        np.testing.assert_array_equal(back.predict_proba(X), forest.predict_proba(X))
        np.testing.assert_array_equal(back.model_.feature_importances_, forest.model_.feature_importances_)
        assert [t.random_state for t in back.model_.estimators_] == [t.random_state for t in forest.model_.estimators_]
    assert isinstance(forest.model_, RandomForestClassifier)  # saving left the fitted forest as it was


def test_a_mice_random_forest_predicts_sklearns_probabilities_bit_for_bit_walking_all_trees_at_once() -> None:
    """Prediction walks every tree at once in numpy (one row in ~2 ms, where sklearn's loop over 1000 trees took
    0.14-0.35 s per gate request), adding the trees' probabilities in sklearn's own order; features exactly on a
    split's threshold go where sklearn sends them (float32 features against float64 thresholds)."""
    X, y = toy_data(n=300, n_features=12)
    forest = MiceRandomForest(n_estimators=200, n_jobs=1).fit(X, y)
    trees = forest.model_.estimators_
    on_edges = np.array([[t.tree_.threshold[0] if t.tree_.feature[0] == j else 0.5 for j in range(12)]
                         for t in trees[:20]])
    for rows in (X, X[:1], on_edges, X.astype(np.float32).astype(np.float64) + 1e-9):
        np.testing.assert_array_equal(forest.predict_proba(rows)[:, 1], forest.model_.predict_proba(rows)[:, 1])


def test_a_forest_on_one_feature_walks_trees_of_different_depths() -> None:
    """One column (``features=conf_only``) on a few calls: some trees are a lone leaf or stop early while others
    still split, so the walk reads the column at leaves too; it must not reach past it (sklearn marks a leaf's
    feature -2)."""
    X, y = toy_data(n=45, n_features=1)
    forest = MiceRandomForest(n_estimators=200, n_jobs=1).fit(X, y)
    depths = {t.tree_.max_depth for t in forest.model_.estimators_}
    assert len(depths) > 1
    np.testing.assert_array_equal(forest.predict_proba(X)[:, 1], forest.model_.predict_proba(X)[:, 1])


def test_a_forest_saved_before_packing_still_loads() -> None:
    X, y = toy_data(n=60, n_features=6)
    forest = MiceRandomForest(n_estimators=5, n_jobs=1).fit(X, y)
    old_state = {k: v for k, v in vars(forest).items() if k != "walk_"}  # __getstate__ before packing
    back = MiceRandomForest.__new__(MiceRandomForest)
    back.__setstate__(old_state)
    np.testing.assert_array_equal(back.predict_proba(X), forest.predict_proba(X))


def test_mice_logistic_regression_reads_strength_2_as_c_one_half() -> None:
    X, y = toy_data()
    assert MiceLogisticRegression().fit(X, y).model_.C == 0.5
