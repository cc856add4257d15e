"""Protocols end to end on a synthetic feature set: which rows train, which are predicted."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import BaseEstimator

from mice_exp.estimators import MiceLogisticRegression
from mice_exp.features import FeatureSet
from mice_exp.errors import UserError
from mice_exp.protocols import Loao, Protocol, make_protocol

APIS = ("add_date", "get_weather", "search_web", "send_mail")
#: Every fit of a SpyEstimator: (APIs of the rows it trained on, splits of those rows, rows it predicted).
FITS: list[dict] = []


class SpyEstimator(BaseEstimator):
    """Reads row numbers from column 0 and remembers what it trained on and what it predicted;
    its confidence for a row is the row number / 1000, so the protocol's output order can be checked."""

    def __init__(self, fs: FeatureSet | None = None):
        self.fs = fs

    def design(self, fs: FeatureSet, source: str) -> np.ndarray:
        """What a protocol hands it: the feature view (column 0 the row number)."""
        return fs.X

    def fit(self, X: np.ndarray, y: np.ndarray) -> SpyEstimator:
        rows = X[:, 0].astype(int)
        self.fit_ = {"apis": set(self.fs.apis[rows]), "splits": set(self.fs.splits[rows]), "predicted": []}
        FITS.append(self.fit_)
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        rows = X[:, 0].astype(int)
        self.fit_["predicted"] += rows.tolist()
        p = rows / 1000
        return np.column_stack([1 - p, p])


def feature_set(per_api: int = 12, seed: int = 0) -> FeatureSet:
    """4 APIs with train / validation / test rows interleaved; column 0 is the row number."""
    rng = np.random.default_rng(seed)
    n = per_api * len(APIS)
    apis = np.array([APIS[i % len(APIS)] for i in range(n)])
    splits = np.array([("train", "train", "validation", "test")[(i // len(APIS)) % 4] for i in range(n)])
    labels = (rng.random(n) < 0.5).astype(int)
    confidence = np.clip(0.3 + 0.4 * labels + rng.normal(0, 0.2, n), 0.01, 0.99)
    X = np.column_stack([np.arange(n), confidence])
    return FeatureSet(ids=[f"{a}/{i}" for i, a in enumerate(apis)], apis=apis, splits=splits, labels=labels,
                      confidence=confidence, X=X, columns=["row", "confidence"], layer_scores=None)


@pytest.fixture(autouse=True)
def clean_log():
    FITS.clear()


def test_loao_predicts_every_test_row_once_with_a_model_blind_to_its_api():
    fs = feature_set()
    p, model = Loao().predict(SpyEstimator(fs), fs)

    assert model is None  # one model per API: none to save as a gate
    test_rows = np.flatnonzero(fs.rows("test"))
    assert p == pytest.approx(test_rows / 1000)  # in test-row order
    predicted = [row for fit in FITS for row in fit["predicted"]]
    assert sorted(predicted) == test_rows.tolist()  # each test row exactly once
    assert len(FITS) == len(APIS)
    for fit in FITS:
        (held_out,) = set(fs.apis[fit["predicted"]])
        assert fit["apis"] == set(APIS) - {held_out}
        assert fit["splits"] == {"train"}


def test_loao_skips_an_api_without_test_rows():
    fs = feature_set()
    fs.splits[(fs.apis == "send_mail") & fs.rows("test")] = "validation"
    p, _ = Loao().predict(SpyEstimator(fs), fs)
    assert len(FITS) == len(APIS) - 1
    assert len(p) == fs.rows("test").sum()


def test_loao_with_a_real_estimator_gives_a_confidence_per_test_row():
    fs = feature_set()
    p, _ = Loao().predict(MiceLogisticRegression(), fs)
    assert p.shape == (fs.rows("test").sum(),)
    assert np.all((p >= 0) & (p <= 1))


@pytest.mark.parametrize("name", ["holdout", "loao", "sample_efficiency"])
def test_each_conf_protocol_is_one_object_of_its_name(name):
    from mice_exp.compose import as_plain, compose_config

    protocol = make_protocol(as_plain(compose_config([f"protocol={name}"]))["protocol"])
    assert isinstance(protocol, Protocol) and protocol.name == name and callable(protocol.run)


def test_a_protocol_name_that_is_not_its_class_is_one_line():
    with pytest.raises(UserError, match=r"protocol.name='kfold', but protocol._target_=mice_exp.protocols.Loao "
                                        r"is the 'loao' protocol; expected protocol.name=loao"):
        make_protocol({"name": "kfold", "_target_": "mice_exp.protocols.Loao"})
    with pytest.raises(UserError, match=r"protocol._target_='mice_exp.protocols.KFold': Error locating target"):
        make_protocol({"name": "kfold", "_target_": "mice_exp.protocols.KFold"})
