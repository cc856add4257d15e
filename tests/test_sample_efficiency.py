"""Sample-efficiency protocol (MICE §6, Figure 7) on a small synthetic grid."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from mice_exp.estimators import HistogramRegression, MiceLogisticRegression, MiceRandomForest
from mice_exp.estimators.base import FallbackWarning
from mice_exp.estimators.inputs import BaseAndRepresentation
from mice_exp.features import FeatureSet
from mice_exp.protocols.sample_efficiency import (
    TABLE_COLUMNS,
    partitions,
    sample_efficiency_figure,
    sample_efficiency_scores,
    summarise,
)


def feature_set(n_train: int = 60, n_test: int = 80, n_features: int = 5, accuracy: float = 0.6,
                seed: int = 0) -> FeatureSet:
    """Labels, an informative confidence and features; rows are train, then validation (10), then test."""
    rng = np.random.default_rng(seed)
    n = n_train + 10 + n_test
    latent = rng.normal(size=n)
    labels = (latent + rng.normal(size=n) > np.quantile(latent, 1 - accuracy)).astype(int)
    confidence = 1 / (1 + np.exp(-(1.0 + latent + 0.5 * rng.normal(size=n))))
    X = np.column_stack([0.3 * latent[:, None] + rng.normal(size=(n, n_features - 1)), confidence])
    splits = np.array(["train"] * n_train + ["validation"] * 10 + ["test"] * n_test)
    return FeatureSet(ids=[f"e{i}" for i in range(n)], apis=np.array([f"api{i % 4}" for i in range(n)]),
                      splits=splits, labels=labels, confidence=confidence, X=X,
                      columns=[f"f{i}" for i in range(n_features - 1)] + ["confidence"], layer_scores=None)


def estimators() -> dict:
    return {"hre": HistogramRegression(), "mice_lr": MiceLogisticRegression(),
            "mice_rf": MiceRandomForest(n_estimators=8, max_depth=4, max_features=3, seed=1, n_jobs=-1)}


SIZES = (10, 20, 30)  # 6, 3 and 2 groups of the 60 training rows


@pytest.fixture(scope="module")
def fs():
    return feature_set()


@pytest.fixture(scope="module")
def sequential(fs):
    return sample_efficiency_scores(estimators(), fs, sizes=SIZES, trials=2, seed=0, n_jobs=1)


def test_partitions_are_disjoint_groups_of_the_size():
    groups = partitions(103, 25, trial=2, seed=7)
    assert groups.shape == (4, 25)
    assert np.unique(groups).size == 100 and groups.min() >= 0 and groups.max() < 103
    np.testing.assert_array_equal(groups, partitions(103, 25, trial=2, seed=7))
    assert not np.array_equal(groups, partitions(103, 25, trial=3, seed=7))


def test_scores_cover_every_estimator_size_trial_and_group(sequential):
    assert len(sequential) == 3 * 2 * (6 + 3 + 2)  # estimators x trials x groups per trial
    counts = sequential.groupby(["estimator", "size", "trial"]).size()
    assert counts.xs(10, level="size").eq(6).all() and counts.xs(30, level="size").eq(2).all()
    assert list(sequential["estimator"].unique()) == ["hre", "mice_lr", "mice_rf"]
    assert sequential["auc_etcu"].between(-1, 1).all()


def test_table_shape_and_columns(sequential):
    table = summarise(sequential)
    assert list(table.columns) == TABLE_COLUMNS
    assert len(table) == 3 * len(SIZES)
    assert table["n_groups"].tolist() == [6, 3, 2] * 3
    assert (table["trials"] == 2).all() and (table["std_source"] == "groups").all()
    np.testing.assert_allclose(table["std"], np.sqrt(table["var"]))


def test_same_seed_same_table_other_seed_other_partitions(fs, sequential):
    again = sample_efficiency_scores(estimators(), fs, sizes=SIZES, trials=2, seed=0, n_jobs=1)
    pd.testing.assert_frame_equal(sequential, again, check_exact=True)
    other = sample_efficiency_scores(estimators(), fs, sizes=(10,), trials=2, seed=1, n_jobs=1)
    assert not np.array_equal(other["auc_etcu"], sequential.loc[sequential["size"] == 10, "auc_etcu"])


def test_trials_are_a_prefix_of_a_longer_run(fs, sequential):
    longer = sample_efficiency_scores(estimators(), fs, sizes=(10,), trials=3, seed=0, n_jobs=1)
    pd.testing.assert_frame_equal(longer[longer.trial < 2].reset_index(drop=True),
                                  sequential[sequential["size"] == 10].reset_index(drop=True), check_exact=True)


def test_parallel_equals_sequential(fs, sequential):
    parallel = sample_efficiency_scores(estimators(), fs, sizes=SIZES, trials=2, seed=0, n_jobs=2)
    pd.testing.assert_frame_equal(parallel, sequential, check_exact=True)


def test_oversize_is_skipped_with_a_warning(fs):
    with pytest.warns(UserWarning, match=r"skipping sizes \[500\]"):
        table = summarise(sample_efficiency_scores({"hre": HistogramRegression()}, fs, sizes=(30, 500), trials=2,
                                                   n_jobs=1))
    assert table["size"].tolist() == [30]


def test_sizes_all_larger_than_the_training_split_fail_instead_of_an_empty_table(fs):
    from mice_exp.errors import UserError

    with pytest.raises(UserError, match=r"every size is larger than the \d+ training rows"):
        sample_efficiency_scores({"hre": HistogramRegression()}, fs, sizes=(500, 750), trials=2, n_jobs=1)


def test_single_class_groups_fall_back_silently():
    fs = feature_set(accuracy=0.95, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        table = summarise(sample_efficiency_scores({"mice_lr": MiceLogisticRegression()}, fs, sizes=(3, 30), trials=5,
                                                   n_jobs=1))
    rate = table.set_index("size")["fallback_rate"]
    assert rate[3] > 0 and rate[30] == 0


def test_a_single_group_takes_its_error_bar_across_trials():
    scores = pd.DataFrame({"estimator": "e", "size": 9, "trial": [0, 1, 2], "group": 0,
                           "auc_etcu": [0.1, 0.2, 0.3], "fallback": False})
    row = summarise(scores).iloc[0]
    assert row["n_groups"] == 1 and np.isnan(row["var"]) and row["std_source"] == "trials"
    assert row["mean"] == pytest.approx(0.2) and row["std"] == pytest.approx(0.1)


def test_summary_statistics_by_hand():
    auc = [0.0, 0.2, 0.4, 0.4, 0.6, 0.8]  # trial 0: mean 0.2, var 0.04; trial 1: mean 0.6, var 0.04
    scores = pd.DataFrame({"estimator": "e", "size": 5, "trial": [0, 0, 0, 1, 1, 1], "group": [0, 1, 2] * 2,
                           "auc_etcu": auc, "fallback": [True] + [False] * 5})
    row = summarise(scores).iloc[0]
    assert row["mean"] == pytest.approx(0.4) and row["var"] == pytest.approx(0.04)
    assert row["std"] == pytest.approx(0.2) and row["sd_trial_means"] == pytest.approx(np.sqrt(0.08))
    assert row["fallback_rate"] == pytest.approx(1 / 6)


def test_a_calibrator_reads_its_confidence_source(fs):
    noise = np.random.default_rng(5).random(len(fs.ids))  # an uninformative "p_true"
    flipped = FeatureSet(**{**fs.__dict__, "sources": {"p_true": noise}})
    kwargs = dict(sizes=(30,), trials=2, n_jobs=1)
    raw = summarise(sample_efficiency_scores({"hre": HistogramRegression()}, flipped, **kwargs))
    assert raw.equals(summarise(sample_efficiency_scores({"hre": HistogramRegression()}, fs, **kwargs)))
    other = summarise(sample_efficiency_scores({"hre": HistogramRegression()}, flipped, sources={"hre": "p_true"},
                                               **kwargs))
    assert not np.isclose(other["mean"].iloc[0], raw["mean"].iloc[0])


def test_caller_estimators_are_not_modified(fs):
    rf = MiceRandomForest(n_estimators=4, max_depth=3, max_features=3, n_jobs=-1)
    sample_efficiency_scores({"mice_rf": rf}, fs, sizes=(30,), trials=1, n_jobs=1)
    assert rf.n_jobs == -1 and not hasattr(rf, "model_")


def test_figure_has_one_error_bar_series_per_estimator_on_log_x(sequential):
    fig = sample_efficiency_figure(summarise(sequential), labels={"mice_rf": "MICE RF"})
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["hre", "mice_lr", "MICE RF"]
    assert len(ax.containers) == 3  # ErrorbarContainer per estimator
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=50)
    assert buffer.getvalue().startswith(b"\x89PNG")


def study(overrides: list[str] = ()):
    from mice_exp.compose import as_plain, compose_config
    from mice_exp.estimation import Study

    return Study.from_config(as_plain(compose_config(["protocol=sample_efficiency", *overrides])))


def test_the_protocol_object_builds_its_estimators_from_the_composed_baselines(fs):
    from mice_exp.protocols import SampleEfficiency
    from mice_exp.tracking.schema import SAMPLE_EFFICIENCY_CSV, SAMPLE_EFFICIENCY_FIGURE

    outcome = SampleEfficiency(sizes=[30], trials=2, n_jobs=1, estimators=["hre", "mice_lr"]).run(study(), fs)
    table, fig = outcome.tables[SAMPLE_EFFICIENCY_CSV], outcome.figures[SAMPLE_EFFICIENCY_FIGURE]
    assert table["estimator"].tolist() == ["hre", "mice_lr"] and outcome.rows == []
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["HRE", "MICE LR"]


def test_the_protocol_logs_every_fit_behind_its_table(fs):
    """The fits are what a reader needs to re-check a mean or a crossing without refitting."""
    from mice_exp.protocols import SampleEfficiency
    from mice_exp.protocols.sample_efficiency import summarise
    from mice_exp.tracking.schema import SAMPLE_EFFICIENCY_CSV, SAMPLE_EFFICIENCY_FITS_CSV

    outcome = SampleEfficiency(sizes=[15, 30], trials=3, n_jobs=1, estimators=["hre"]).run(study(), fs)
    fits = outcome.tables[SAMPLE_EFFICIENCY_FITS_CSV]
    assert len(fits) == 3 * sum(int(fs.rows("train").sum()) // size for size in (15, 30))
    pd.testing.assert_frame_equal(summarise(fits), outcome.tables[SAMPLE_EFFICIENCY_CSV])


def test_a_baseline_override_reaches_the_sample_efficiency_estimators(fs):
    from mice_exp.protocols import SampleEfficiency

    grid = SampleEfficiency(sizes=[30], trials=1, n_jobs=1, estimators=["hre"])
    assert study(["baselines.hre.model.n_bins=2"]).candidate("hre", "protocol.estimators").estimator.n_bins == 2
    coarse = grid.run(study(["baselines.hre.model.n_bins=2"]), fs).tables["sample_efficiency.csv"]
    fine = grid.run(study(), fs).tables["sample_efficiency.csv"]
    assert coarse["mean"].iloc[0] != fine["mean"].iloc[0]


class FieldLike(MiceLogisticRegression):
    """Routed like a field correction (its base's input, then a representation: here the feature view);
    records the width of every matrix it is fitted on."""

    reads = BaseAndRepresentation()
    representation = "features"
    widths: list = []

    def __init__(self, base=None, C=0.5, max_iter=1000):
        super().__init__(C=C, max_iter=max_iter)
        self.base = base

    def fit(self, X, y):
        FieldLike.widths.append(X.shape[1])
        return super().fit(X, y)


def test_estimators_share_an_input_matrix_only_when_their_inputs_are_identical(fs):
    """The latent bug of the string-keyed slots: a field correction and a calibrator of the same
    confidence got one cached matrix. Slots are now the inputs' content, so they cannot collide."""
    from mice_exp.protocols.sample_efficiency import input_slot

    field, calibrator = FieldLike(base=HistogramRegression()), HistogramRegression()
    assert field.design(fs).shape[1] == 1 + fs.X.shape[1] and calibrator.design(fs).shape[1] == 1
    assert input_slot(field.design(fs)) != input_slot(calibrator.design(fs))
    assert input_slot(calibrator.design(fs)) == input_slot(HistogramRegression().design(fs))
    FieldLike.widths = []
    sample_efficiency_scores({"hre": calibrator, "field": field}, fs, sizes=(30,), trials=1, n_jobs=1)
    assert FieldLike.widths == [1 + fs.X.shape[1]] * 2  # 2 groups of 30; never HRE's single column
