"""FieldCorrection: a base estimator plus the local correction of the miscalibration field."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

from mice_exp.estimators import FieldCorrection, MiceLogisticRegression, RawConfidence
from mice_exp.estimators.blocks import side_by_side

FAST = {"max_epochs": 3, "sigmas": [0.3], "lambdas": [0.01], "num_threads": 1}


def regime_data(n: int, seed: int = 0):
    """X: the base's input (a raw confidence of 0.7 everywhere) beside a representation x; y: correct 95% of
    the time where x0 > 0, 45% elsewhere."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    y = (rng.random(n) < np.where(x[:, 0] > 0, 0.95, 0.45)).astype(int)
    return side_by_side({"base": np.full((n, 1), 0.7), "representation": x}), y


def test_the_correction_moves_each_regime_towards_its_accuracy_and_stays_in_0_1():
    X, y = regime_data(600)
    model = FieldCorrection(RawConfidence(), preset="synthetic", field=FAST | {"lr": 1e-3, "max_epochs": 30}).fit(X, y)
    assert model.base_width_ == 1
    Xt, _ = regime_data(400, seed=1)
    p = model.predict_proba(Xt)[:, 1]
    assert np.all((p >= 0) & (p <= 1))
    x0 = Xt["representation__0"].to_numpy()
    good, bad = x0 > 0, x0 <= 0
    assert p[good].mean() > 0.75 and p[bad].mean() < 0.65  # raw says 0.7 in both
    assert model.signed_field(Xt)[good].mean() > 0 > model.signed_field(Xt)[bad].mean()


def test_it_is_an_sklearn_estimator_that_clones_with_its_base():
    model = FieldCorrection(MiceLogisticRegression(), field=FAST)
    copy = clone(model)
    assert isinstance(copy.base, MiceLogisticRegression) and copy.base is not model.base
    assert copy.get_params()["field"] == FAST


def test_x_without_the_base_and_representation_blocks_is_a_clear_error():
    X, y = regime_data(100)
    with pytest.raises(ValueError, match="reads X as the named blocks base__\\* then representation__\\*, got no block"):
        FieldCorrection(RawConfidence(), field=FAST).fit(X.to_numpy(), y)


def test_a_field_that_learned_nothing_has_no_diagnostics_instead_of_an_attribute_error():
    """One training class: the estimator falls back to the base rate, and the run says there is no field."""
    import warnings

    from mice_exp.protocols import Outcome
    from mice_exp.protocols.table import diagnose_field

    X, _ = regime_data(40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FieldCorrection(RawConfidence(), field=FAST).fit(X, np.zeros(40, dtype=int))
    outcome = Outcome()
    diagnose_field(outcome, model, fs=None, source="raw", options={})
    assert model.fallback_ and outcome.metrics == {} and outcome.regions is None
    assert "miscalibration field: not fitted" in outcome.text
