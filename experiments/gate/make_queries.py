"""Write ``queries.jsonl``: 100 STE queries the gate has never seen, round-robin over the APIs after
the first 3 (the gate in README.md was trained on the first 3 APIs, `dataset.max_apis=3`).

    python experiments/gate/make_queries.py      # -> experiments/gate/queries.jsonl

Each line is a gate query (id, query, tools); the gold call stays in STE and score.py reads it.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from mice_exp.compose import compose_config
from mice_exp.data.records import Example
from mice_exp.data import select_examples
from mice_exp.paths import paths_from

N, SKIP_APIS = 100, 3
HERE = Path(__file__).resolve().parent


def ste_examples() -> list[Example]:
    """All 750 STE calls, found as the pipeline finds them (dataset.path, ../shared, download)."""
    cfg = compose_config(["dataset=ste", "dataset.max_apis=null"])
    return select_examples(cfg["dataset"], paths_from(cfg["paths"])).examples


def main() -> None:
    by_api: dict[str, list] = {}
    for example in ste_examples():
        by_api.setdefault(example.api, []).append(example)
    unseen = list(by_api.values())[SKIP_APIS:]
    mixed = [e for row in itertools.zip_longest(*unseen) for e in row if e is not None][:N]
    lines = [json.dumps({"id": e.id, "query": e.query, "tools": e.tools, "tool_names": list(e.tool_names)})
             for e in mixed]
    (HERE / "queries.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} queries over {len({e.api for e in mixed})} APIs to {HERE / 'queries.jsonl'}")


if __name__ == "__main__":
    main()
