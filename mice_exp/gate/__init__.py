"""A deployable confidence gate: a saved pipeline that, for a new query and its tools, returns the
LLM's call, its calibrated probability of being correct, and execute / abstain at a risk setting.

    from mice_exp.gate import Gate, save_gate

    save_gate("gate/", pipeline, fitted_estimator, fs.view, demo_pool)   # after a holdout fit of a Pipeline
    gate = Gate.load("gate/")                                           # or "runs:/<run id>/gate"
    decision = gate.check(messages, tools)          # an OpenAI chat request -> Decision(call, probability, ...)
    gate.decide([{"id": 1, "query": "...", "tools": "API_name: ...\\n..."}])   # the batch command's JSON answers

``mice-exp serve`` puts it behind an OpenAI-compatible endpoint (:mod:`mice_exp.gate.app`).

Saved without pickle (JSON, text and skops); see :mod:`mice_exp.gate.artifact`.
"""

from mice_exp.gate.artifact import load_estimator, read_spec, save_gate, trusted_types
from mice_exp.gate.build import fit_gate, save_run_gate
from mice_exp.gate.chat import Call, Decision, InvalidRequest
from mice_exp.gate.command import gate as gate_command
from mice_exp.gate.gate import Gate
from mice_exp.gate.loading import check_pipeline
from mice_exp.gate.queries import BadLine, parse_query, read_queries
from mice_exp.gate.registry import fetch, log_gate, model_name, register_gate

__all__ = [
    "BadLine",
    "Call",
    "Decision",
    "Gate",
    "InvalidRequest",
    "check_pipeline",
    "fetch",
    "fit_gate",
    "gate_command",
    "load_estimator",
    "log_gate",
    "model_name",
    "parse_query",
    "read_queries",
    "read_spec",
    "register_gate",
    "save_gate",
    "save_run_gate",
    "trusted_types",
]
