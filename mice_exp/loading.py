"""Loading a transformers model from a folder by the class its ``config.json`` names, every weight checked.

A model whose weights do not all load is initialised at random where they are missing and still runs: its
features, lens strings or embeddings are then noise, different in every process, with a warning as the only
sign. bert-score chose its encoder class from substrings of the path it was handed (``"t5" in model_type``
loads a ``T5EncoderModel``), so under a folder named ``t5`` every BERTScore feature came from a random T5
encoder. Every model the project loads comes through :func:`load_checked`, which refuses such a load in one line.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from mice_exp.errors import UserError

#: Weights a checkpoint may lack because nothing the project runs reads them: a BERT encoder's pooler (BERTScore
#: reads token states, the retrieval encoder mean-pools them).
READ_BY_NOTHING = (r"(.*\.)?pooler\..*",)


def load_checked(cls: Any, source: Any, what: str, allow: Sequence[str] = READ_BY_NOTHING, **kwargs: Any) -> Any:
    """``cls.from_pretrained(source, **kwargs)`` (``cls``: an ``Auto*`` class, so the class comes from the
    config), refused in one line naming ``what`` (the setting that chose ``source``) where a weight the model
    has was not in the checkpoint, or the checkpoint held one it has not, or one of another shape (names matching a
    regex of ``allow`` excepted)."""
    model, info = cls.from_pretrained(source, output_loading_info=True, **kwargs)
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        names = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get(kind) or ())
        names = [n for n in names if not any(re.fullmatch(pattern, n) for pattern in allow)]
        if names:
            problems.append(f"{len(names)} {kind.replace('_keys', '')} (e.g. {names[0]!r})")
    if problems:
        raise UserError(f"{what}={str(source)!r}: the {type(model).__name__} its config names loaded with weights "
                        f"{', '.join(problems)}; expected a checkpoint holding every weight of that model")
    return model
