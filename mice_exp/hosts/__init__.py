"""The gate inside the hosts agents run in: it scores each tool call the agent's own model proposes, before the
tool runs, and holds the calls it does not trust.

- :mod:`mice_exp.hosts.openai_agents`: ``GateGuard`` for the OpenAI Agents SDK (a tool input guardrail that
  blocks, or ``needs_approval`` that asks a person).
- :mod:`mice_exp.hosts.langchain_middleware`: ``GateMiddleware`` for LangChain 1.x ``create_agent`` (blocks,
  or hands held calls to ``HumanInTheLoopMiddleware``).

Each host module imports its framework (the ``hosts`` extra); this package and :mod:`mice_exp.hosts.scoring`
import neither, nor torch: over HTTP (``mice-exp serve``) the agent's process needs no model.
"""

from mice_exp.hosts.scoring import GateScorer, GateUnavailable, Guarded, HttpScorer, Scorer, Verdict, scorer

__all__ = ["GateScorer", "GateUnavailable", "Guarded", "HttpScorer", "Scorer", "Verdict", "scorer"]
