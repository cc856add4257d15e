"""``python -m mice_exp.llm.shard_worker CONFIG WORKER``: one local worker of a sharded LLM stage.

:func:`mice_exp.llm.shards.run_workers` starts it with the stage's config groups it wrote and this worker's
number; it computes that worker's batches (``llm.shard``) and nothing else. Its own module, so that the
stage, which starts the workers, and the worker, which runs the stage, do not import each other.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Sequence

from mice_exp.cache import read_json
from mice_exp.errors import UserError
from mice_exp.llm.stage import LLMStage
from mice_exp.paths import Paths


def main(argv: Sequence[str]) -> None:
    """A bad input is one line and exit status 2, as from ``mice-exp``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = read_json(Path(argv[0]))
    try:
        LLMStage.from_settings(spec["stage"], Paths(root=Path(spec["root"]), cache=Path(spec["cache"])),
                               shard=int(argv[1])).run()
    except UserError as error:
        print(f"mice-exp: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
