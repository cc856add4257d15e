"""Two records files' confidence sources on the calls both scored, as ``benchmarks/reproduce.py`` compares its two
backends: P(True)'s largest difference, how many greedy answers are equal, the sampled sources as distributions.

    python benchmarks/source_agreement.py experiments/records/ste-smollm2_135m.jsonl.gz VLLM_RECORDS [--json FILE]

(The second file: the same records with some sources computed on the engine, ``mice-exp records
llm.backend=vllm llm.records=FIRST sources.use=[...] output=SECOND``; ``--sources`` names those.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reproduce import SOURCES, sameness, source_agreement  # benchmarks/, the script's own folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--sources", default=",".join(SOURCES),
                        help="the sources the second file computed anew (the others it carries from the first)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    found = {**sameness(args.first, args.second),
             "sources": source_agreement(args.first, args.second, args.sources.split(","))}
    print(f"{found['calls']} calls in both ({found['only_one']} in one file only), {found['same_label']} with the "
          f"same label, {found['same_tokens']} with the same generated tokens")
    for name, figures in found["sources"].items():
        print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
