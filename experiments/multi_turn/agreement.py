"""The project's per-step labels against ``bfcl-eval``'s own multi-turn checker, on the calls an LLM decoded.

    python experiments/multi_turn/agreement.py experiments/records/bfcl_multi_turn_base30-smollm2_135m.jsonl.gz \\
        dataset.max_conversations=30

The records' steps are rebuilt from the data set (Hydra overrides after the file; ``dataset=bfcl_multi_turn`` is
implied), the model's call of each step read from its record (``pred_api`` / ``pred_args``), and
:func:`~mice_exp.data.bfcl_multi_turn.checker_agreement` runs BFCL's ``multi_turn_checker`` per step and per
conversation. Prints the agreement (counts and Cohen's kappa); ``--out FILE`` writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from mice_exp.compose import as_plain, compose_config
from mice_exp.data import make_dataset
from mice_exp.data.bfcl_multi_turn import checker_agreement
from mice_exp.data.labels import made_call
from mice_exp.llm.records import read_records_file
from mice_exp.paths import paths_from


def kappa(pairs: list[tuple[bool, bool]]) -> float | None:
    """Cohen's kappa of two binary labellings (None where chance agreement is total: one label throughout)."""
    n = len(pairs)
    observed = sum(a == b for a, b in pairs) / n
    first, second = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
    chance = first * second + (1 - first) * (1 - second)
    return None if chance == 1 else (observed - chance) / (1 - chance)


def summary(pairs: list[tuple[bool, bool]]) -> dict[str, object]:
    counts = Counter(pairs)
    return {"n": len(pairs), "both right": counts[True, True], "both wrong": counts[False, False],
            "ours only right": counts[True, False], "bfcl only right": counts[False, True],
            "agreement": sum(a == b for a, b in pairs) / len(pairs), "kappa": kappa(pairs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides that select the records' steps")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cfg = as_plain(compose_config(["dataset=bfcl_multi_turn", *args.overrides]))
    steps = {e.id: e for e in make_dataset(cfg["dataset"]).select(paths_from(cfg["paths"])).examples}
    records = {r["id"]: r for r in read_records_file(args.records, dataset="bfcl_multi_turn").records}
    missing = sorted(set(records) - set(steps))
    if missing:
        raise SystemExit(f"{args.records}: {len(missing)} records name steps these overrides do not select "
                         f"(first {missing[0]!r}); expected the overrides the records were made with")
    chosen = [steps[i] for i in records]
    calls = {i: (r["pred_api"], r["pred_args"]) if made_call(r["pred_api"], r["pred_args"]) else None
             for i, r in records.items()}
    by_step, by_conversation = checker_agreement(chosen, calls)
    step_pairs = [(bool(records[i]["label"]), verdict) for i, verdict in by_step.items()]
    every = Counter()
    for i in by_step:
        every[steps[i].gold["entry"]["id"]] += not records[i]["label"]
    conversation_pairs = [(every[c] == 0, verdict) for c, verdict in by_conversation.items()]
    result = {"records": str(args.records), "steps": summary(step_pairs),
              "conversations": summary(conversation_pairs),
              "no-call steps left out": sum(s.gold["call"] is None for s in chosen)}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
