"""Action-belief consistency on hand-made agents."""

import numpy as np
import pytest

from mice_exp.metrics import MEDIUM, etcu
from mice_exp.metrics.action_belief import action_belief_consistency, decision_agreement

CONF = np.linspace(0.01, 0.99, 100)
GRADED = np.array([(i % 10) < (i // 10) for i in range(100)])  # bin k (by confidence) acts k times in 10


def test_a_step_agent_is_consistent_but_ties_keep_it_below_one():
    assert 0.8 < action_belief_consistency(CONF, CONF > 0.5) < 1.0


def test_an_agent_that_acts_more_when_confident_is_perfectly_consistent():
    assert action_belief_consistency(CONF, GRADED) == pytest.approx(1.0)


def test_an_agent_that_acts_more_when_unsure_is_maximally_inconsistent():
    assert action_belief_consistency(CONF, ~GRADED) == pytest.approx(-1.0)


def test_rates_are_paired_with_percentile_bin_midpoints():
    acted = np.array([1.0 if 0.3 < c < 0.7 else 0.0 for c in CONF])  # acts in the middle only
    rho = action_belief_consistency(CONF, acted)
    assert -0.5 < rho < 0.5


def test_constant_behaviour_and_missing_confidences():
    assert np.isnan(action_belief_consistency(CONF, np.ones(100)))
    conf = np.concatenate([CONF, np.full(50, np.nan)])
    acted = np.concatenate([GRADED, np.zeros(50, dtype=bool)])  # the missing rows are ignored
    assert action_belief_consistency(conf, acted) == pytest.approx(1.0)


def test_agreement_with_the_mbr_decision_and_the_agents_own_utility():
    p = np.array([0.9, 0.2, 0.7, 0.4])
    acted = np.array([1, 1, 0, 0])
    y = np.array([1, 0, 1, 0])
    assert decision_agreement(p, acted, MEDIUM) == 0.5  # agrees on examples 0 and 3
    assert etcu(acted.astype(float), y, MEDIUM) == pytest.approx((1 - 1) / 4)  # one tp, one fp
