"""dataset=tooltalk: ToolTalk's conversations per gold call, labelled by ToolTalk's own matching, and a run on
tiny_random."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from conftest import tiny_run
from mice_exp.compose import as_plain, compose_config
from mice_exp.data import make_dataset
from mice_exp.data.labels import gold_api, is_correct
from mice_exp.data.tooltalk import arguments
from mice_exp.errors import UserError
from mice_exp.paths import PACKAGE_ROOT, Paths
from mice_exp.tracking.schema import trajectory_key


def tooltalk(tmp_path: Path, *overrides: str):
    dataset = make_dataset(as_plain(compose_config(["dataset=tooltalk", *overrides]))["dataset"])
    return dataset, dataset.select(Paths(root=PACKAGE_ROOT, cache=tmp_path))


def test_every_gold_call_of_the_78_conversations_is_a_step(tmp_path):
    dataset, selection = tooltalk(tmp_path)
    assert len(selection.examples) == 266 and not dataset.skipped  # ToolTalk's 266 turn-aligned calls
    assert len({dataset.conversation(e) for e in selection.examples}) == 78
    splits_of: dict[str, set[str]] = {}
    for e in selection.examples:
        splits_of.setdefault(dataset.conversation(e), set()).add(selection.splits[e.id])
    assert all(len(s) == 1 for s in splits_of.values())
    step = next(e for e in selection.examples if e.id.endswith("AccountTools-Alarm-Calendar-AddAlarm-0/5/1"))
    assert (gold_api(step), arguments(step.gold["call"])) == ("AddAlarm", {"time": "07:30:00"})
    roles = [t.role for t in step.conversation.turns]  # the gold history ToolTalk's runner shows before it
    assert roles == ["user", "assistant", "user", "assistant", "tool", "assistant", "user", "assistant", "tool"]
    assert step.conversation.system.startswith("You are a helpful assistant. Here is some user data:\nlocation: ")
    assert "session_token" not in step.demo  # ToolTalk's executor adds it; the docs do not offer it


def test_a_call_is_right_by_tooltalk_s_own_matching(tmp_path):
    _, selection = tooltalk(tmp_path, "dataset.folders=[tooltalk]")
    step = next(e for e in selection.examples if e.id.endswith("AccountTools-Alarm-Calendar-AddAlarm-0/5/1"))
    assert is_correct(step, "AddAlarm", {"time": "07:30:00"})
    assert not is_correct(step, "AddAlarm", {"time": "08:00:00"}) and not is_correct(step, None, None)
    assert not is_correct(step, "FindAlarms", {})  # another API
    assert not is_correct(step, "AddAlarm", {"when": "07:30:00"})  # ToolTalk's exception for a bad argument


def test_settings_are_checked_before_anything_loads():
    with pytest.raises(UserError, match=r"^dataset\.api_mode='some'; expected one of all, suite, exact$"):
        make_dataset(as_plain(compose_config(["dataset=tooltalk", "dataset.api_mode=some"]))["dataset"])


@pytest.mark.slow
def test_tooltalk_runs_end_to_end_on_tiny_random(tmp_path):
    result, records = tiny_run(tmp_path, "dataset=tooltalk", "dataset.folders=[easy]", "dataset.api_mode=exact",
                               "dataset.max_per_api=2")
    assert Counter(r["dataset"] for r in records) == {"tooltalk": len(records)} and len(records) >= 10
    assert "objective" in result
    # whole conversations scored too: each record names its conversation, the run logs trajectory scores
    assert all(r["conversation"] == r["id"].rsplit("/", 2)[0] for r in records)
    assert result[trajectory_key("", "n")] >= 1 and trajectory_key("raw", "product_brier") in result
