"""``llm.backend=openai``: generation by any OpenAI-compatible server (``vllm serve``, TGI, llama.cpp's server).

The stage's prompts are token ids built with the model's own tokenizer (``llm.source``; no weights load), sent
as they are to ``/v1/completions``, so the server sees exactly the prompt ``hf`` would generate from. Each
call comes back with its text and the chosen tokens' log-probabilities (raw confidence), and nothing of the
model's internals: views and estimators that read hidden states or layer strings are refused before the run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from mice_exp.errors import UserError
from mice_exp.llm.backends import Backend, SeededSources
from mice_exp.llm.generation import Generation, no_lens, no_states, truncate
from mice_exp.llm.prompt import option_token_ids
from mice_exp.llm.settings import LLMSettings
from mice_exp.llm.toolcall import REACT, CallFormat

TOKEN_ID = "token_id:"  # vLLM's spelling of a token when asked for ids (return_tokens_as_token_ids)


@dataclass
class Endpoint:
    """A model behind an OpenAI-compatible ``/v1/completions``, with the tokenizer its prompts are built with."""

    client: Any
    model: str
    tokenizer: Any
    name: str
    base_url: str
    eos: list[int]
    n_layers: ClassVar[int] = 0  # records with no layers: no layer strings, no states
    hidden_size: ClassVar[int] = 0

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, fmt: CallFormat) -> list[Generation]:
        """Greedy completions of a batch in one request; each cut at EOS and at the call's stop in the reply
        format ``fmt``, as ``hf`` cuts it."""
        return [self._generation(choice, fmt) for choice in self.complete(prompts, max_new_tokens, temperature=0.0)]

    def complete(self, prompts: Sequence[Sequence[int]], max_tokens: int, **sampling: Any) -> list[Any]:
        """The choices of one ``/v1/completions`` request for token-id prompts, in order, each with its tokens
        named by id and their log-probabilities: ``n`` per prompt, or the request is refused in one line (a server
        answering fewer would silently drop calls)."""
        extra = {"return_tokens_as_token_ids": True} | sampling.pop("extra_body", {})
        response = self.request(prompt=[list(p) for p in prompts], max_tokens=max_tokens, logprobs=1,
                                extra_body=extra, **sampling)
        n = int(sampling.get("n") or 1)
        choices = sorted(response.choices, key=lambda c: c.index)
        if [c.index for c in choices] != list(range(len(prompts) * n)):
            raise UserError(f"the server at {self.base_url} returned {len(choices)} choices for {len(prompts)} "
                            f"prompts; expected one per prompt (n={n} each), indexed in order: a server that takes a "
                            "batch of token-id prompts in one request (vllm serve)")
        return choices

    def token_ids(self, choice: Any) -> list[int]:
        """The generated token ids of a choice (tokens named ``token_id:N``); one line for a server naming them
        only by text, from which the sources cannot rebuild the ids."""
        tokens = list(choice.logprobs.tokens) if choice.logprobs is not None else []
        if not all(t.startswith(TOKEN_ID) for t in tokens):
            raise UserError(f"the server at {self.base_url} names tokens by their text; the confidence sources "
                            "need token ids (vLLM's return_tokens_as_token_ids); expected vllm serve or sources.use=[]")
        return [int(t[len(TOKEN_ID):]) for t in tokens]

    def request(self, **body: Any) -> Any:
        """One ``/v1/completions`` request; a server that is down, slow, refuses the model or answers in another
        shape is one line."""
        response = self.parsed(lambda: self.client.completions.with_raw_response.create(model=self.model, **body),
                               "/v1/completions")
        if not isinstance(getattr(response, "choices", None), list):
            raise UserError(f"the server at {self.base_url} answered a completion without 'choices'; expected an "
                            "OpenAI-compatible /v1/completions (a list of choices with their logprobs)")
        if response.model not in (None, self.model):
            raise UserError(f"the server at {self.base_url} answered as model {response.model!r}, not "
                            f"llm.model={self.model!r}; expected the server of that model (or llm.model naming it)")
        return response

    def parsed(self, ask: Any, path: str) -> Any:
        """What one request to ``path`` returns, parsed; one line for a server that is down, slow, refuses it or
        answers with something other than JSON (an HTML page: the address of a web server, not of an API)."""
        import openai

        try:
            raw = ask()
        except openai.APIConnectionError as error:
            what = "did not answer in time" if isinstance(error, openai.APITimeoutError) else "is not reachable"
            raise UserError(f"llm.base_url={self.base_url} {what} ({error.__cause__ or error}); expected a running "
                            "OpenAI-compatible server (e.g. vllm serve MODEL), or a larger llm.timeout_s") from None
        except openai.NotFoundError:
            raise UserError(f"llm.model={self.model!r}: the server at {self.base_url} does not serve it; expected "
                            f"one of {self.served()}") from None
        except openai.APIStatusError as error:
            raise UserError(f"the server at {self.base_url} refused the request (HTTP {error.status_code}: "
                            f"{_message(error)}); expected it to accept token-id prompts with logprobs") from None
        kind = raw.headers.get("content-type", "no content type").split(";")[0]
        if "json" not in kind:
            raise UserError(f"the server at {self.base_url} answered {path} with {kind}, not JSON; expected an "
                            "OpenAI-compatible API at llm.base_url (e.g. http://HOST:8000/v1 of vllm serve)")
        try:
            return raw.parse()
        except (ValueError, TypeError) as error:
            raise UserError(f"the server at {self.base_url} answered {path} with JSON of another shape ({error}); "
                            "expected an OpenAI-compatible API") from None

    def served(self) -> list[str]:
        """The model names the server lists (``/v1/models``); none where it lists none (a server without the
        listing, or not reachable: the request that follows says so)."""
        import openai

        try:
            listing = self.client.models.with_raw_response.list()
        except openai.APIError:
            return []
        return [m.id for m in getattr(self.parsed(lambda: listing, "/v1/models"), "data", None) or []]

    def check(self) -> None:
        """The endpoint, once before the stage: the model among those it lists (where it lists them), and one
        one-token request answered in the shape every later one must have (:meth:`request`)."""
        served = self.served()
        if served and self.model not in served:
            raise UserError(f"llm.model={self.model!r}: the server at {self.base_url} does not serve it; expected "
                            f"one of {served}")
        (choice,) = self.complete([self.tokenizer.encode("Hello")], 1, temperature=0.0)
        self._generation(choice, REACT)

    def _generation(self, choice: Any, fmt: CallFormat) -> Generation:
        logprobs = choice.logprobs
        if logprobs is None or not logprobs.token_logprobs:
            raise UserError(f"the server at {self.base_url} returned no token log-probabilities; expected a server "
                            "that honours logprobs=1 (raw confidence is the chosen tokens' probability)")
        tokens, values = list(logprobs.tokens), np.array(logprobs.token_logprobs, dtype=np.float64)
        if all(t.startswith(TOKEN_ID) for t in tokens):
            ids, offsets, text = truncate(self.tokenizer, [int(t[len(TOKEN_ID):]) for t in tokens], self.eos, fmt)
        else:  # a server that names tokens only by their text
            ids, offsets, text = [], *_cut_text(tokens, fmt)
        n = len(offsets)
        return Generation(token_ids=ids, token_probs=np.exp(values[:n]), text=text, offsets=offsets,
                          lens_ids=no_lens(n), states=no_states(n))


class EndpointCall:
    """One call's source prompts sent to the server (its prefix cache, where it has one, shares their prefix)."""

    def __init__(self, endpoint: Endpoint, seed: int):
        self.endpoint, self.seed = endpoint, seed

    def p_true(self, prompt: Sequence[int]) -> float:
        """P(A) / (P(A) + P(B)) for the option tokens after ``prompt``, each scored as the last token of an echoed
        prompt (no token is generated), so the probabilities are the model's own over its whole vocabulary."""
        options = [(o, t) for o in "AB" for t in option_token_ids(self.endpoint.tokenizer, o)]
        choices = self.endpoint.complete([[*prompt, t] for _, t in options], 0, echo=True, temperature=0.0)
        mass = {"A": 0.0, "B": 0.0}
        for (option, _), choice in zip(options, choices):
            scored = list(choice.logprobs.token_logprobs or []) if choice.logprobs is not None else []
            if len(scored) <= len(prompt):
                raise UserError(f"the server at {self.endpoint.base_url} ignored echo=true (log-probabilities "
                                f"of {len(scored)} tokens, not of the {len(prompt) + 1}-token prompt); P(True) needs "
                                "them; expected a server that echoes prompts with logprobs (vllm serve) or sources.use "
                                "without p_true")
            mass[option] += float(np.exp(scored[len(prompt)]))
        return mass["A"] / (mass["A"] + mass["B"])

    def greedy(self, prompt: Sequence[int], max_new_tokens: int, fmt: CallFormat) -> list[int]:
        (choice,) = self.endpoint.complete([prompt], max_new_tokens, temperature=0.0)
        return self.endpoint.token_ids(choice)

    def samples(self, prompt: Sequence[int], k: int, temperature: float, max_new_tokens: int,
                fmt: CallFormat) -> list[list[int]]:
        """``k`` continuations in one request (``n``), seeded, with no top-k or top-p cut (as ``hf`` samples)."""
        choices = self.endpoint.complete([prompt], max_new_tokens, n=k, temperature=temperature, top_p=1.0,
                                         seed=self.seed, extra_body={"top_k": -1})
        return [self.endpoint.token_ids(c) for c in choices]


class EndpointSources(SeededSources):
    """The confidence sources of a black-box model (``llm.backend=openai``): P(True) from the log-probabilities the
    server gives the option tokens, the verbalized and way-out replies greedy, the k samples of self-consistency
    and semantic entropy drawn by the server, each call seeded apart."""

    def __init__(self, endpoint: Endpoint):
        super().__init__(endpoint.tokenizer, endpoint.eos)
        self.endpoint = endpoint

    def call(self, prompts: Sequence[Sequence[int]]) -> EndpointCall:
        return EndpointCall(self.endpoint, self.next_seed())


def _cut_text(tokens: Sequence[str], fmt: CallFormat) -> tuple[list[tuple[int, int]], str]:
    """Character spans of the tokens given as text, cut at the call's stop (as :func:`truncate` cuts ids)."""
    ends = list(np.cumsum([len(t) for t in tokens]))
    text = "".join(tokens)
    stop = fmt.stop_offset(text)
    keep = len(tokens) if stop is None else next((n for n, end in enumerate(ends, 1) if end >= stop), len(tokens))
    ends = [int(e) for e in ends[:keep]]
    return list(zip([0] + ends[:-1], ends)), text[:ends[-1] if ends else 0]


def _message(error: Any) -> str:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or body)
    return str(error)


class OpenAI(Backend):
    """A black box behind an HTTP endpoint: text and token probabilities, no layers, no model of its own to replay
    states on; the server itself computes the sources (:class:`EndpointSources`)."""

    name = "openai"
    internals = False
    replays = False
    source_method = "endpoint-1"  # the server's own sampling and numerics

    @classmethod
    def check(cls, settings: LLMSettings) -> None:
        """An address, a model name and the client's settings, before anything loads."""
        super().check(settings)
        if not settings.base_url or not settings.model:
            raise UserError("llm.backend=openai needs llm.base_url (e.g. http://127.0.0.1:8000/v1) and llm.model (the "
                            "name the server serves); expected both set")
        retries, timeout = settings.max_retries, settings.timeout_s
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise UserError(f"llm.max_retries={retries!r}; expected a non-negative integer (retries of a failed "
                            "request)")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise UserError(f"llm.timeout_s={timeout!r}; expected a number of seconds > 0 (how long a request may "
                            "take)")

    def key(self) -> dict[str, Any]:
        """The engine and the model name the server serves."""
        return {"backend": self.name, "model": self.settings.model}

    def load(self) -> Endpoint:
        """The endpoint ``llm.base_url`` serving ``llm.model`` (key from the variable ``llm.api_key_env``), with the
        tokenizer of ``llm.source`` (no weights load)."""
        import openai

        from mice_exp.llm.model import load_tokenizer  # loads torch

        cfg = self.settings
        self.check(cfg)
        key = os.environ.get(cfg.api_key_env or "OPENAI_API_KEY") or "EMPTY"
        client = openai.OpenAI(base_url=cfg.base_url, api_key=key, timeout=float(cfg.timeout_s),
                               max_retries=int(cfg.max_retries))
        tokenizer = load_tokenizer(cfg.source, self.models)
        eos = [t for t in (tokenizer.eos_token_id,) if t is not None]
        endpoint = Endpoint(client=client, model=cfg.model, tokenizer=tokenizer, name=cfg.name,
                            base_url=cfg.base_url, eos=eos)
        endpoint.check()  # a server that is not one: one line now, not a traceback mid-stage
        return endpoint

    def source_runner(self) -> EndpointSources:
        return EndpointSources(self.generator())


BACKEND = OpenAI
