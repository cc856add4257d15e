"""Score a gate's answers against STE's gold calls: was what it executed right, and what it held back wrong?

    python experiments/gate/score.py experiments/gate/answers.jsonl
"""

from __future__ import annotations

import json
import sys

from mice_exp.data.labels import is_correct
from make_queries import ste_examples


def main(path: str) -> None:
    gold = {e.id: e for e in ste_examples()}
    counts = {("execute", True): 0, ("execute", False): 0, ("abstain", True): 0, ("abstain", False): 0}
    probs: dict[bool, list[float]] = {True: [], False: []}
    for line in open(path, encoding="utf-8"):
        answer = json.loads(line)
        if answer.get("error"):
            continue
        call = answer["call"] or {}
        right = is_correct(gold[answer["id"]], call.get("api"), call.get("args"))
        counts[(answer["decision"], right)] += 1
        probs[right].append(answer["probability"])
    n = sum(counts.values())
    print(f"{n} answered; calls correct: {counts[('execute', True)] + counts[('abstain', True)]}")
    for decision in ("execute", "abstain"):
        right, wrong = counts[(decision, True)], counts[(decision, False)]
        share = f"{right / (right + wrong):.0%} correct" if right + wrong else "none"
        print(f"  {decision:<8} {right + wrong:>3}  ({right} correct, {wrong} wrong: {share})")
    for right, values in probs.items():
        if values:
            print(f"  mean probability of the {'correct' if right else 'wrong'} calls: {sum(values) / len(values):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
