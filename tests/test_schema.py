"""The results schema: every key the job builds, the report can parse back."""

from __future__ import annotations

from mice_exp.compose import as_plain, compose_config
from mice_exp.tracking import schema


def test_baseline_and_action_belief_keys_round_trip():
    assert schema.baseline_key("hre", "etcu_low") == "baseline.hre.etcu_low"
    assert schema.parse_baseline_key(schema.baseline_key("hre", "etcu_low")) == ("hre", "etcu_low")
    assert schema.parse_action_belief_key(schema.action_belief_key("mice_rf", "agree_high")) == ("mice_rf", "agree_high")


def test_parsers_reject_other_metrics():
    for name in ("auc_etcu", "baseline.hre", "field.frac_over", schema.pvalue_key("smece", "hre")):
        assert schema.parse_baseline_key(name) is None
    assert schema.parse_action_belief_key(schema.agent_key("act_rate")) is None


def test_job_tags_identify_a_run_by_its_config():
    cfg = as_plain(compose_config(["estimator=mice_lr", "protocol=loao", "risk=high"]))
    tags = schema.job_tags(cfg)
    assert set(tags) == {*schema.KEY_TAGS, schema.RISK_TAG, schema.SELECTION_TAG}
    assert (tags["estimator"], tags["protocol"], tags["risk"], tags["selection"]) == ("mice_lr", "loao", "high", "all")


def test_the_selection_names_the_settings_that_cut_the_data_set():
    assert schema.selection({"apis": None, "max_apis": None, "max_per_api": None}) == "all"
    assert schema.selection({"apis": None, "max_apis": 3}) == "max_apis=3"
    assert schema.selection({"apis": ["live_simple", "multiple"], "max_per_api": 20}) == \
        "apis=[live_simple,multiple],max_per_api=20"
    assert schema.selection({"max_conversations": 10}) == "max_conversations=10"
