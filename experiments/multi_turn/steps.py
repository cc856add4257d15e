"""What an LLM did on the steps of a multi-turn records file (BFCL v4 multi-turn, ToolTalk): how many steps and
conversations are right (95% Wilson intervals), how many replies hold no parsed call, which calls are named, the
raw confidence of right and wrong steps, and its smECE and AUROC (a 95% bootstrap interval over conversations)
where both classes occur. One JSON per records file, printed as markdown.

    python experiments/multi_turn/steps.py experiments/records/tooltalk-suite-gemma3_270m.jsonl.gz [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from mice_exp.llm.records import read_records_file
from mice_exp.metrics.calibration import auroc, smece, wilson_interval
from mice_exp.metrics.trajectory import trajectories


def conversation(record: dict[str, Any]) -> str:
    """A step's conversation: its field, or its id less the turn and step (records written before the field)."""
    return record.get("conversation") or record["id"].rsplit("/", 2)[0]


def by_conversation_auroc(groups: dict[str, list[dict[str, Any]]], draws: int = 1000) -> list[float]:
    """AUROC of raw confidence over every step of ``groups`` (conversation -> its steps), with a 95% percentile
    interval resampling whole conversations (steps of one conversation are not independent); resamples with one
    class are skipped."""
    names, rng, found = sorted(groups), np.random.default_rng(0), []
    for _ in range(draws):
        picked = [r for n in rng.choice(names, len(names)) for r in groups[n]]
        labels = [r["label"] for r in picked]
        if 0 < sum(labels) < len(labels):
            found.append(auroc([r["raw_confidence"] for r in picked], labels))
    steps = [r for n in names for r in groups[n]]
    point = auroc([r["raw_confidence"] for r in steps], [r["label"] for r in steps])
    return [point, *np.percentile(found, [2.5, 97.5]).tolist()]


def summary(path: Path) -> dict[str, Any]:
    records = read_records_file(path).records
    right = sum(r["label"] for r in records)
    groups = defaultdict(list)
    for r in records:
        groups[conversation(r)].append(r)
    p = np.array([r["raw_confidence"] for r in records])
    y = np.array([r["label"] for r in records])
    every = int(trajectories([conversation(r) for r in records], p, y)["right"].sum())
    out: dict[str, Any] = {
        "records": path.name, "steps": len(records), "right": right, "right_wilson": wilson_interval(right, len(records)),
        "conversations": len(groups), "every_step_right": every,
        "every_step_right_wilson": wilson_interval(every, len(groups)),
        "no_parsed_call": sum(r.get("parse_error") is not None for r in records),
        "calls_named": Counter(r["pred_api"] for r in records if r.get("pred_api")).most_common(8),
        "right_by_api": Counter(r["pred_api"] for r in records if r["label"]).most_common(),
        "raw_confidence_mean": {"right": float(p[y == 1].mean()) if right else None, "wrong": float(p[y == 0].mean())},
    }
    if 0 < right < len(records):
        out["raw_smece"] = smece(p, y)
        out["raw_auroc_by_conversation"] = by_conversation_auroc(groups)
    return out


def markdown(s: dict[str, Any]) -> str:
    low, high = s["right_wilson"]
    right = s["raw_confidence_mean"]["right"]
    lines = [f"- **{s['right']} of {s['steps']} steps right** (95% Wilson [{low:.3f}, {high:.3f}]) over "
             f"{s['conversations']} conversations, {s['every_step_right']} with every step right; "
             f"{s['no_parsed_call']} replies with no parsed call.",
             "- Calls named most: " + ", ".join(f"`{a}` {n}" for a, n in s["calls_named"]) + "; right ones: "
             + (", ".join(f"`{a}` {n}" for a, n in s["right_by_api"]) or "none") + ".",
             f"- Raw confidence {s['raw_confidence_mean']['wrong']:.3f} on wrong steps"
             + ("" if right is None else f", {right:.3f} on right ones") + " on average."]
    if "raw_auroc_by_conversation" in s:
        a, lo, hi = s["raw_auroc_by_conversation"]
        lines.append(f"- Raw confidence over every step: smECE {s['raw_smece']:.3f}, AUROC {a:.3f} "
                     f"[{lo:.3f}, {hi:.3f}] (bootstrap over conversations).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    s = summary(args.records)
    print(markdown(s))
    if args.json:
        args.json.write_text(json.dumps(s, indent=2) + "\n")


if __name__ == "__main__":
    main()
