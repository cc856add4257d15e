"""Selective-prediction metrics: a hand-computed case, an independent threshold loop, the edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from mice_exp.metrics import aurc, prr, risk_coverage_curve

# Five calls, most confident first: correct, wrong, correct, correct, wrong.
P = np.array([0.9, 0.8, 0.7, 0.3, 0.2])
Y = np.array([1, 0, 1, 1, 0])


def test_a_five_call_case_matches_the_hand_computation() -> None:
    # Accuracy of the k kept calls: 1, 1/2, 2/3, 3/4, 3/5; its mean A = 211/300, so AURC = 89/300.
    # Oracle keeps the three correct first: 1, 1, 1, 3/4, 3/5 -> 261/300; random keeps 3/5 = 180/300.
    coverage, risk = risk_coverage_curve(P, Y)
    np.testing.assert_allclose(coverage, [0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_allclose(risk, [0, 1 / 2, 1 / 3, 1 / 4, 2 / 5])
    # Exact fractions computed in float64: 1e-12 absorbs the rounding of five-term sums.
    assert aurc(P, Y) == pytest.approx(89 / 300, abs=1e-12)
    assert prr(P, Y) == pytest.approx((211 - 180) / (261 - 180), abs=1e-12)


def _threshold_loop(p: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """AURC and PRR the slow way: accept every call with confidence >= t, for each distinct t."""
    risks, accuracies, oracle = [], [], []
    for t in sorted(set(p), reverse=True):
        kept = y[p >= t]
        risks.append(1 - kept.mean())
        accuracies.append(kept.mean())
    for k in range(1, len(y) + 1):
        oracle.append(min(k, y.sum()) / k)
    area = float(np.mean(accuracies))
    return float(np.mean(risks)), (area - y.mean()) / (np.mean(oracle) - y.mean())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_a_loop_over_thresholds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 200)
    p = 0.5 * y + 0.5 * rng.random(200)  # continuous in [0, 1): no ties, one call per threshold
    expected_aurc, expected_prr = _threshold_loop(p, y)
    # Same sums in another order: float64 rounding over 200 terms stays far below 1e-9.
    assert aurc(p, y) == pytest.approx(expected_aurc, abs=1e-9)
    assert prr(p, y) == pytest.approx(expected_prr, abs=1e-9)


def test_oracle_is_one_reversed_oracle_is_negative_and_a_constant_is_random() -> None:
    assert prr(Y.astype(float), Y) == pytest.approx(1.0, abs=1e-12)  # float rounding only
    assert prr(1.0 - Y, Y) < 0
    # A constant confidence is one tie group: every call counts at the base rate, exactly random.
    assert prr(np.full(5, 0.4), Y) == pytest.approx(0.0, abs=1e-12)
    assert aurc(np.full(5, 0.4), Y) == pytest.approx(1 - Y.mean(), abs=1e-12)


def test_a_single_class_test_set_has_no_ranking_to_judge() -> None:
    assert np.isnan(prr([0.2, 0.9, 0.5], [1, 1, 1]))
    assert np.isnan(aurc([0.2, 0.9, 0.5], [0, 0, 0]))


def test_bad_input_says_what_was_wrong() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        prr([0.5, 0.6], [1])
