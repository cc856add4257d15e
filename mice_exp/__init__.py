"""mice_exp: experiments on when to trust an LLM's tool call."""

__version__ = "0.1.0"
