"""scikit-learn's own estimator checks over every estimator class in mice_exp.estimators.

Small settings (a few trees, two folds, one epoch) keep the whole file well under a minute. A check that
cannot hold for a class is listed with the reason, and must fail (strict): the labels say whether a call
is correct (0 or 1, never {1, 2} or strings), a calibrator reads one confidence in [0, 1] (the checks
feed several columns of any sign), a field correction reads two named blocks (the checks feed a plain
matrix; tests/test_field_estimator.py fits it on its blocks).
"""

from __future__ import annotations

import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from mice_exp.estimators import ConfidenceEstimator, MiceLogisticRegression, estimator_classes
from mice_exp.estimators.inputs import BaseAndRepresentation, OneConfidence

#: Small settings, by parameter name, for every class that takes one: a few trees, two folds, one epoch, and a base
#: for a field correction.
SMALL = {"n_estimators": 5, "n_jobs": 1, "cv": 2, "base": MiceLogisticRegression(),
         "field": {"max_epochs": 1, "sigmas": [0.3], "lambdas": [0.01]}}


def small(cls: type[ConfidenceEstimator]) -> ConfidenceEstimator:
    """An instance of ``cls`` with the :data:`SMALL` settings it takes."""
    estimator = cls()
    return estimator.set_params(**{k: v for k, v in SMALL.items() if k in estimator.get_params(deep=False)})


#: Every class :func:`estimator_classes` finds: a new estimator's module is checked with no line here.
ESTIMATORS = [small(cls) for cls in estimator_classes()]

LABELS = "fits labels {1, 2} or strings; y says whether a call is correct, 0 or 1"
#: What every estimator refuses: labels other than 0 and 1.
OTHER_LABELS = {check: LABELS for check in ("check_estimators_dtypes", "check_classifier_data_not_an_array",
                                            "check_classifiers_classes", "check_fit2d_1feature")}
#: Checks that fit (and predict) a matrix of their own making, which a calibrator or a field correction refuses.
OWN_MATRIX = ("check_fit_score_takes_y", "check_estimators_overwrite_params", "check_dont_overwrite_parameters",
              "check_estimators_fit_returns_self", "check_readonly_memmap_input", "check_n_features_in_after_fitting",
              "check_positive_only_tag_during_fit", "check_dtype_object", "check_pipeline_consistency",
              "check_estimators_pickle", "check_f_contiguous_array_estimator", "check_classifiers_one_label",
              "check_classifiers_train", "check_supervised_y_2d", "check_methods_sample_order_invariance",
              "check_methods_subset_invariance", "check_fit2d_1sample", "check_dict_unchanged", "check_fit_idempotent",
              "check_fit_check_is_fitted", "check_n_features_in", "check_fit2d_predict1d")
LAYOUT = {OneConfidence: "feeds several columns of any sign; a calibrator reads one confidence in [0, 1]",
          BaseAndRepresentation: "feeds a plain matrix; a field correction reads the named blocks base__* and "
                                 "representation__*"}


def expected_failed_checks(estimator: ConfidenceEstimator) -> dict[str, str]:
    """What cannot hold for ``estimator``, and why."""
    layout = LAYOUT.get(type(estimator.reads))
    return OTHER_LABELS | ({check: layout for check in OWN_MATRIX} if layout else {})


def test_every_small_setting_reaches_a_class():
    """A renamed parameter would otherwise run its class's checks at full size (1000 trees, five folds)."""
    taken = {name for estimator in ESTIMATORS for name in estimator.get_params(deep=False)}
    assert set(SMALL) <= taken


@pytest.mark.filterwarnings("ignore::mice_exp.estimators.FallbackWarning")  # one-label checks: the base rate, as meant
@parametrize_with_checks(ESTIMATORS, expected_failed_checks=expected_failed_checks, xfail_strict=True)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
