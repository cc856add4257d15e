"""Metrics pinned on hand-computed cases from MICE §3, ACUTE's euro and relplot's smECE."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import relplot
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from mice_exp.metrics import (
    ALPHA,
    HIGH,
    LOW,
    MEDIUM,
    PAPER_RISKS,
    TAU_GRID,
    PermutationResult,
    Risk,
    accuracy,
    always_abstain,
    always_execute,
    auc_etcu,
    auc_etcu_rows,
    auc_euro,
    auroc,
    base_rate,
    binned_ece,
    brier,
    etcu,
    etcu_curve,
    etcu_rows,
    euro,
    euro_curve,
    evaluate,
    mbr_threshold,
    oracle,
    permutation_test,
    smece,
    smece_rows,
)
from mice_exp.metrics.permutation import FIRST_BLOCK

RISK_CONF = Path(__file__).resolve().parents[1] / "conf" / "risk"

# Five tool calls: three correct (y = 1), two wrong.
P = np.array([0.95, 0.7, 0.6, 0.3, 0.05])
Y = np.array([1, 1, 0, 1, 0])


def random_case(seed: int, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random(n), rng.integers(0, 2, n)


# --- thresholds (Eq. 2 and Eq. 3) ---------------------------------------------------------


@pytest.mark.parametrize(("risk", "tau"), [(LOW, 0.1), (MEDIUM, 0.5), (HIGH, 0.9)])
def test_the_three_mice_settings_give_their_table_1_thresholds(risk: Risk, tau: float) -> None:
    assert risk.tau == tau


def test_eq2_in_general() -> None:
    # (tn - fp) / ((tp - fn) + (tn - fp)) = (0.5 + 3) / ((2 + 0.5) + (0.5 + 3)) = 3.5 / 6
    assert mbr_threshold(tp=2, fp=-3, tn=0.5, fn=-0.5) == pytest.approx(3.5 / 6)


@pytest.mark.parametrize("fp", [-1 / 9, -0.25, -1.0, -4.0, -9.0])
def test_eq3_is_eq2_with_tp_1_and_tn_fn_0(fp: float) -> None:
    assert Risk(tp=1, fp=fp, tn=0, fn=0).tau == pytest.approx(fp / (fp - 1), abs=1e-12)


def test_threshold_ignores_positive_scaling_and_shifting_of_utilities() -> None:
    scaled = Risk(tp=3 * 1 + 7, fp=3 * -4 + 7, tn=3 * 0 + 7, fn=3 * 0 + 7)
    assert scaled.tau == pytest.approx(0.8)


@pytest.mark.parametrize(
    "utilities", [dict(tp=0, fp=-1, tn=0, fn=0), dict(tp=1, fp=0.5, tn=0, fn=0)]
)
def test_utilities_without_a_decision_to_make_are_rejected(utilities: dict) -> None:
    with pytest.raises(ValueError, match="tp > fn and tn > fp"):
        Risk(**utilities)


@pytest.mark.parametrize(("name", "tau"), [("low", 0.1), ("medium", 0.5), ("high", 0.9), ("custom", 0.8)])
def test_risk_configs_build_risks_with_their_thresholds(name: str, tau: float) -> None:
    cfg = OmegaConf.load(RISK_CONF / f"{name}.yaml")
    risk = Risk(tp=cfg.tp, fp=cfg.fp, tn=cfg.tn, fn=cfg.fn)
    assert cfg.name == name
    assert risk.tau == tau
    if name in PAPER_RISKS:
        assert risk == PAPER_RISKS[name]


# --- expected tool-calling utility --------------------------------------------------------


def test_etcu_by_hand() -> None:
    # tau 0.1 executes all but 0.05: three right (+1 each), one wrong (-1/9): (3 - 1/9) / 5
    assert etcu(P, Y, LOW) == pytest.approx(26 / 45)
    # tau 0.5 executes 0.95, 0.7 (right) and 0.6 (wrong, -1): (2 - 1) / 5
    assert etcu(P, Y, MEDIUM) == pytest.approx(0.2)
    # tau 0.9 executes only 0.95 (right): 1 / 5
    assert etcu(P, Y, HIGH) == pytest.approx(0.2)


def test_etcu_with_nonzero_tn_and_fn() -> None:
    risk = Risk(tp=2, fp=-3, tn=1, fn=-0.5)  # tau = 4 / 6.5 = 0.615: executes 0.95 and 0.7
    # two right calls executed (+2 each), 0.6 and 0.05 wrong and avoided (+1 each), 0.3 right but skipped
    assert etcu(P, Y, risk) == pytest.approx((2 + 2 + 1 + 1 - 0.5) / 5)


def test_confidence_equal_to_tau_abstains() -> None:
    assert etcu([0.1], [0], LOW) == 0.0  # would be -1/9 if it executed
    assert etcu([0.5], [1], MEDIUM) == 0.0  # would be 1 if it executed
    assert etcu([0.9], [0], HIGH) == 0.0


def test_curve_at_the_paper_thresholds_matches_the_paper_settings() -> None:
    # Eq. 3 inverted (fp = tau / (tau - 1)) must agree with the Eq. 2 risks it came from.
    curve = etcu_curve(P, Y, [0.1, 0.5, 0.9])
    np.testing.assert_allclose(curve, [etcu(P, Y, LOW), etcu(P, Y, MEDIUM), etcu(P, Y, HIGH)])


def test_auc_etcu_by_hand() -> None:
    # Both calls right: utility 1 for tau < 0.25 (249 grid points), 1/2 for 0.25 <= tau < 0.75
    # (500 points), 0 after: (249 + 250) / 999.
    assert auc_etcu([0.25, 0.75], [1, 1]) == pytest.approx(499 / 999)


def test_auc_etcu_of_always_executing_a_wrong_call() -> None:
    # Utility fp = -k / (1000 - k) at tau = k / 1000; summing gives 1000 * H_999 - 999.
    harmonic_999 = np.sum(1 / np.arange(1, 1000))
    assert auc_etcu([1.0], [0]) == pytest.approx(-(1000 * harmonic_999 - 999) / 999)


def test_oracle_utility_is_the_accuracy_at_every_risk() -> None:
    _, y = random_case(0)
    np.testing.assert_allclose(etcu_curve(oracle(y), y), accuracy(y))
    assert auc_etcu(oracle(y), y) == pytest.approx(accuracy(y))


def test_always_abstain_scores_zero_everywhere() -> None:
    _, y = random_case(1)
    assert np.all(etcu_curve(always_abstain(y), y) == 0)
    assert auc_etcu(always_abstain(y), y) == 0


def test_always_execute_pays_every_wrong_call() -> None:
    _, y = random_case(2)
    acc = accuracy(y)
    np.testing.assert_allclose(
        etcu_curve(always_execute(y), y), acc + (1 - acc) * TAU_GRID / (TAU_GRID - 1)
    )


def test_base_rate_executes_until_tau_reaches_the_accuracy() -> None:
    y = np.array([1, 1, 1, 0])  # accuracy 0.75
    curve = etcu_curve(base_rate(y), y)
    below = TAU_GRID < 0.75
    np.testing.assert_allclose(curve[below], etcu_curve(always_execute(y), y)[below])
    assert np.all(curve[~below] == 0)


def test_utilities_over_rows_are_the_utilities_of_each_row() -> None:
    """Rows of 200 calls, half the confidences on the tau grid (p == tau abstains), and rows of one call."""
    rng = np.random.default_rng(1)
    for n in (1, 200):
        p, y = rng.random((50, n)), rng.integers(0, 2, n)
        p[:, : n // 2] = np.round(p[:, : n // 2], 3)
        for risk in PAPER_RISKS.values():
            np.testing.assert_array_equal(etcu_rows(p, y, risk), [etcu(row, y, risk) for row in p])
        np.testing.assert_allclose(auc_etcu_rows(p, y), [auc_etcu(row, y) for row in p], rtol=0, atol=1e-14)
        np.testing.assert_allclose(auc_etcu_rows(p, np.tile(y, (50, 1))), auc_etcu_rows(p, y), rtol=0, atol=0)


# --- euro ---------------------------------------------------------------------------------


def test_euro_by_hand() -> None:
    p, y = [0.9, 0.6, 0.2], [1, 0, 0]
    # u_ca = 0.5 executes 0.9 (tp) and 0.6 (fp), avoids 0.2: (1 + 0.5 (1 - 1)) / (1 + 0.5 (2 - 1))
    assert euro(p, y, 0.5) == pytest.approx(2 / 3)
    # u_ca = 0.7 executes only 0.9, like the oracle
    assert euro(p, y, 0.7) == pytest.approx(1.0)


def test_euro_at_zero_risk_is_the_fraction_of_correct_calls_executed() -> None:
    assert euro([0.0, 0.5], [1, 1], 0.0) == pytest.approx(0.5)


def test_euro_of_the_oracle_is_one_at_every_risk_including_the_ends() -> None:
    _, y = random_case(3)
    np.testing.assert_allclose(euro_curve(oracle(y), y, np.linspace(0, 1, 101)), 1.0)
    assert auc_euro(oracle(y), y) == pytest.approx(1.0)


def test_euro_is_one_where_even_the_oracle_gains_nothing() -> None:
    assert euro([0.3, 0.8], [0, 0], 0.0) == 1.0  # u_ca = 0 and no correct call to execute
    assert euro([0.3, 0.8], [1, 1], 1.0) == 1.0  # u_ca = 1 and no wrong call to avoid


def test_euro_of_always_abstaining_is_the_share_of_avoidance_utility() -> None:
    y = np.array([1, 1, 1, 0])
    # It gets u_ca for the wrong call only; the oracle also gets (1 - u_ca) for the three right ones.
    assert euro(always_abstain(y), y, 0.2) == pytest.approx(0.2 / (3 * 0.8 + 0.2))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 1, allow_nan=False), st.integers(0, 1)), min_size=1, max_size=40
    ),
    st.floats(0, 1, allow_nan=False),
)
def test_euro_lies_between_zero_and_one(pairs: list[tuple[float, int]], u_ca: float) -> None:
    p, y = (np.array(column) for column in zip(*pairs))
    assert 0.0 <= euro(p, y, u_ca) <= 1.0
    assert 0.0 <= auc_euro(p, y) <= 1.0


# --- calibration --------------------------------------------------------------------------


def test_smece_is_relplots() -> None:
    p, y = random_case(4)
    assert smece(p, y) == relplot.smECE(p, y.astype(float))


def confidence_sets(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of confidences of every shape smECE meets: spread, coarse, bunched near 1, exactly 0 and 1,
    constant, calibrated and not."""
    rng = np.random.default_rng(seed)
    p = rng.random((12, n))
    p[1] = np.round(p[1], 1)
    p[2] = 0.9 + 0.1 * p[2]
    p[3] = rng.integers(0, 2, n)
    p[4] = 0.5
    y = (rng.random((12, n)) < p).astype(int)
    y[5:8] = rng.integers(0, 2, (3, n))
    y[8] = 1
    return p, y


@pytest.mark.parametrize("n", [1, 2, 12, 200, 3000])
def test_smece_rows_is_relplots_row_by_row(n: int) -> None:
    p, y = confidence_sets(n, n)
    expected = [relplot.smECE(row, labels.astype(float)) for row, labels in zip(p, y)]
    np.testing.assert_allclose(smece_rows(p, y), expected, rtol=1e-9, atol=1e-12)


def test_a_row_whose_confidences_are_its_labels_scores_relplots_zero_without_its_slowest_search(monkeypatch) -> None:
    """A degenerate run (labels and confidences all 0, or all 1): relplot's smECE is exactly 0, which its
    bisection finds only at its narrowest kernels (~0.5 s a row, minutes under a report's bootstrap); here
    neither relplot's search nor its fallback runs for such rows, and the others are scored as before."""
    n = 200
    p, y = np.zeros((3, n)), np.zeros((3, n))
    p[1], y[1] = 1.0, 1.0
    p[2], y[2] = random_case(6, n=n)
    expected = [relplot.smECE(row, labels) for row, labels in zip(p, y)]
    assert expected[:2] == [0.0, 0.0]

    def refuse(*args: object) -> None:
        raise AssertionError("relplot's search ran on a row whose residuals are all 0")

    monkeypatch.setattr(relplot, "smECE", refuse)
    monkeypatch.setattr(relplot.metrics, "smooth_ece", refuse)
    np.testing.assert_allclose(smece_rows(p, y), expected, rtol=1e-9, atol=1e-12)
    assert smece(p[0], y[0].astype(int)) == 0.0 and smece(p[1], y[1].astype(int)) == 0.0


def test_smece_rows_take_one_label_vector_for_every_row() -> None:
    p, y = random_case(5, n=40)
    rows = np.stack([p, p[::-1], np.sqrt(p)])
    np.testing.assert_allclose(smece_rows(rows, y), [smece(row, y) for row in rows], rtol=1e-9, atol=1e-12)


def test_binned_ece_by_hand() -> None:
    # Bins of width 0.1; 0.1 opens bin 1 and 1.0 joins 0.9 in the last bin.
    p, y = [0.1, 0.1, 0.9, 0.9, 1.0], [0, 1, 1, 1, 0]
    # bin 1: |0.2 - 1| = 0.8 summed gap; last bin: |2.8 - 2| = 0.8; weighted: 1.6 / 5
    assert binned_ece(p, y, n_bins=10) == pytest.approx(0.32)


def test_binned_ece_is_zero_for_the_base_rate() -> None:
    y = np.array([1, 0, 1, 1])
    assert binned_ece(base_rate(y), y) == pytest.approx(0.0)


def test_brier_auroc_and_accuracy_by_hand() -> None:
    p, y = [0.8, 0.4, 0.6, 0.1], [1, 0, 0, 1]
    assert brier(p, y) == pytest.approx((0.04 + 0.16 + 0.36 + 0.81) / 4)
    assert auroc(p, y) == pytest.approx(0.5)  # pairs (0.8 > 0.4, 0.6), (0.1 < 0.4, 0.6)
    assert accuracy(y) == 0.5


def test_auroc_is_nan_with_one_class() -> None:
    assert np.isnan(auroc([0.2, 0.9], [1, 1]))


@pytest.mark.parametrize(
    ("p", "y", "message"),
    [
        ([0.5, 0.5], [1], "differ in length"),
        ([0.5, 1.2], [1, 0], r"\[0, 1\]"),
        ([0.5, np.nan], [1, 0], "NaN"),
        ([0.5, 0.5], [1, 2], "only 0 and 1"),
        ([], [], "empty"),
    ],
)
def test_bad_inputs_raise_clear_errors(p: list, y: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        brier(p, y)


# --- evaluate -----------------------------------------------------------------------------


def test_evaluate_reports_every_score_under_mlflow_safe_keys() -> None:
    p, y = random_case(5)
    scores = evaluate(p, y, PAPER_RISKS)
    assert list(scores) == [
        "smece", "etcu_low", "etcu_medium", "etcu_high", "auc_etcu", "prr", "aurc",  # the tables' metrics
        "ece", "brier", "auroc", "accuracy", "euro_low", "euro_medium", "euro_high", "auc_euro",
    ]  # fmt: skip
    assert scores["etcu_high"] == etcu(p, y, HIGH)
    assert scores["euro_low"] == euro(p, y, 0.1)
    assert all(isinstance(value, float) for value in scores.values())


def test_evaluate_rejects_risk_names_mlflow_cannot_log() -> None:
    with pytest.raises(ValueError, match="risk name"):
        evaluate([0.5], [1], {"very risky!": HIGH})


# --- permutation test ---------------------------------------------------------------------


def mean_p(p: np.ndarray, y: np.ndarray) -> float:
    """A metric whose permutation test is the sign-flip test of the mean paired difference."""
    return float(np.mean(p))


def mean_p_rows(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.mean(p, axis=-1)


def paired(z: float, n: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two estimators whose n paired differences have the z-score ``z``: the sign-flip test's p is about the
    normal tail's (0.046 at z = 2.0, 0.055 at 1.92), a mark a 1000-permutation draw leaves to chance."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.05, n)
    noise -= noise.mean()
    p_b = rng.uniform(0.3, 0.7, n)
    return p_b + noise + z * np.sqrt(np.sum(noise**2) / (n * (n - z**2))), p_b, rng.integers(0, 2, n)


def test_permutation_p_values_are_uniform_under_the_null() -> None:
    # Two estimators drawn from the same distribution: about 5% of tests should reject at 0.05.
    p_values = []
    for seed in range(300):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 2, 30)
        p_values.append(permutation_test(brier, rng.random(30), rng.random(30), y, seed=seed,
                                         rows_metric=lambda p, y: np.mean((p - y) ** 2, axis=-1)).p_value)
    p_values = np.array(p_values)
    assert 0.02 <= np.mean(p_values < ALPHA) <= 0.09
    assert 0.4 <= np.mean(p_values) <= 0.6


def test_permutation_test_finds_a_planted_difference() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    informed = np.clip(0.2 + 0.6 * y + rng.normal(0, 0.1, 200), 0, 1)
    result = permutation_test(auc_etcu, informed, rng.random(200), y)
    assert result.difference > 0 and result.decided
    assert result.draws == 300 and result.p_value == 1 / 301  # no draw reaches it: decided after the second block


def test_permutation_test_is_symmetric_in_its_two_estimators() -> None:
    p_a, y = random_case(6, n=60)
    p_b = np.clip(p_a + np.random.default_rng(7).normal(0, 0.2, 60), 0, 1)
    metric, rows = partial(etcu, risk=MEDIUM), partial(etcu_rows, risk=MEDIUM)
    forward = permutation_test(metric, p_a, p_b, y, rows_metric=rows)
    backward = permutation_test(metric, p_b, p_a, y, rows_metric=rows)
    assert backward.difference == pytest.approx(-forward.difference)
    assert backward.p_value == forward.p_value


@pytest.mark.parametrize("z", [2.0, 1.92])
def test_a_p_near_alpha_gets_the_same_mark_from_every_seed(z: float) -> None:
    """p ~ 0.046 (marked) and ~ 0.055 (not): the test draws until its 99.9% interval leaves 0.05, so ten seeds
    give ten p-values between 0.04 and 0.06 and one mark; the same seed gives the same p."""
    p_a, p_b, y = paired(z)
    results = [permutation_test(mean_p, p_a, p_b, y, seed=seed, rows_metric=mean_p_rows) for seed in range(10)]
    assert all(r.decided and not r.exact and 0.04 <= r.p_value <= 0.06 for r in results)
    assert {r.p_value < ALPHA for r in results} == {z == 2.0}
    assert permutation_test(mean_p, p_a, p_b, y, seed=3, rows_metric=mean_p_rows) == results[3]
    assert all(r.draws > 10_000 for r in results)  # what deciding costs this close to alpha


def test_a_test_undecided_at_its_cap_is_not_significant() -> None:
    p_a, p_b, y = paired(2.0)
    for seed in range(5):
        result = permutation_test(mean_p, p_a, p_b, y, seed=seed, max_permutations=1000, rows_metric=mean_p_rows)
        assert not result.decided and result.draws == 1000 and result.p_value >= ALPHA  # the interval's upper end


def test_few_differing_examples_are_enumerated_exactly() -> None:
    """Differences +0.4, +0.3, +0.2, -0.1 (observed mean 0.8 / 6) and two examples where both agree: of the
    2^4 sign patterns, |0.4 ± 0.3 ± 0.2 ± 0.1| >= 0.8 for 1.0 and 0.8 and their negatives, p = 4 / 16."""
    p_b = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    p_a = p_b + np.array([0.4, 0.3, 0.2, -0.1, 0.0, 0.0])
    y = np.array([1, 0, 1, 0, 1, 0])
    result = permutation_test(mean_p, p_a, p_b, y)
    assert result.exact and result.decided and result.draws == 16
    assert result.p_value == 4 / 16
    assert permutation_test(mean_p, p_a, p_b, y, seed=1, rows_metric=mean_p_rows) == result


def test_a_decided_mark_is_the_exact_tests_mark() -> None:
    """14 differing calls (16,384 swap patterns, counted here by brute force): the drawn test marks exactly the
    pairs the exact test marks, whether it decides from its draws or goes on to enumerate."""
    marks, enumerated = [], 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 2, 14)
        p_a = np.clip(0.5 + (0.12 * seed / 10) * (2 * y - 1) + rng.normal(0, 0.2, 14), 0, 1)
        p_b = rng.random(14)
        flips = ((np.arange(2**14)[:, None] >> np.arange(14)) & 1).astype(bool)
        null = auc_etcu_rows(np.where(flips, p_b, p_a), y) - auc_etcu_rows(np.where(flips, p_a, p_b), y)
        observed = auc_etcu(p_a, y) - auc_etcu(p_b, y)
        exact = np.mean(np.abs(null) >= abs(observed) - 1e-12)
        result = permutation_test(auc_etcu, p_a, p_b, y, seed=seed, rows_metric=auc_etcu_rows)
        assert result.decided and (result.p_value < ALPHA) == (exact < ALPHA)
        enumerated += result.exact
        marks.append(exact < ALPHA)
    assert 5 <= sum(marks) <= 35 and enumerated < 40  # both marks occur; most tests decide before enumerating


def test_a_p_far_from_alpha_is_decided_by_its_first_block() -> None:
    calls = []

    def counted(p, y):
        calls.append(1)
        return brier(p, y)

    p, y = random_case(3, n=50)
    result = permutation_test(counted, p, p[::-1].copy(), y)
    assert result.p_value > 0.5 and result.decided
    assert result.draws == FIRST_BLOCK and len(calls) == 2 + 2 * FIRST_BLOCK  # the observed pair, then 2 a draw


@pytest.mark.parametrize("seed", [0, 5])  # a test decided in its first block, and one still undecided at its cap
def test_smece_scored_in_blocks_gives_the_same_test(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 30)
    p_a = np.clip(0.5 + 0.1 * seed * (y - 0.5) + rng.normal(0, 0.15, 30), 0, 1)
    p_b = rng.random(30)
    args = (lambda p, y: -smece(p, y), p_a, p_b, y)
    one_by_one = permutation_test(*args, seed=seed, max_permutations=150)
    blocks = permutation_test(*args, seed=seed, max_permutations=150, rows_metric=lambda p, y: -smece_rows(p, y))
    assert blocks == one_by_one
    assert one_by_one.decided == (seed == 0) and one_by_one.p_value >= ALPHA


def test_identical_estimators_are_never_significant() -> None:
    p, y = random_case(8, n=50)
    assert permutation_test(smece, p, p, y) == PermutationResult(0.0, 1.0, draws=1, exact=True, decided=True)


@pytest.mark.parametrize("correct,total", [(0, 50), (3, 15), (22, 50), (50, 50), (1, 2)])
def test_an_accuracy_interval_is_scipys_wilson_interval(correct: int, total: int) -> None:
    from scipy.stats import binomtest

    from mice_exp.metrics.calibration import wilson_interval

    reference = binomtest(correct, total).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson_interval(correct, total) == pytest.approx((reference.low, reference.high), abs=1e-3)


def test_a_conversation_is_as_right_as_its_weakest_step_and_scored_by_proper_rules() -> None:
    from mice_exp.metrics.trajectory import trajectories, trajectory_scores

    frame = trajectories(["a", "a", "b", "b", "c"], [0.9, 0.8, 0.5, 0.4, 0.2], [1, 1, 1, 0, 0])
    assert frame["conversation"].tolist() == ["a", "b", "c"] and frame["steps"].tolist() == [2, 2, 1]
    np.testing.assert_allclose(frame["product"], [0.72, 0.2, 0.2])
    np.testing.assert_allclose(frame["min"], [0.8, 0.4, 0.2])
    assert frame["right"].tolist() == [1, 0, 0]
    scores = trajectory_scores(frame)
    assert scores["n"] == 3 and scores["right_rate"] == pytest.approx(1 / 3)
    assert scores["product_brier"] == pytest.approx((0.28 ** 2 + 0.2 ** 2 + 0.2 ** 2) / 3)
    assert scores["min_log_loss"] == pytest.approx(-(np.log(0.8) + np.log(0.6) + np.log(0.8)) / 3)
    assert scores["product_auroc"] == 1.0
    # the base rate is calibrated but resolves nothing: a proper rule ranks it below the confidences that resolve
    flat = trajectory_scores(frame.assign(product=1 / 3, min=1 / 3))
    assert flat["product_brier"] > scores["product_brier"] and flat["product_auroc"] == 0.5
