"""What a loaded gate runs its calls on: the LLM's backend (from the gate's llm settings), its generator, checked
against the saved gate, and its teacher; the runner that prompts, batches and records with the generator's
tokenizer (:class:`~mice_exp.llm.runner.Runner`, the LLM stage's own); and the retrieval encoder holding the saved
demonstration pool's vectors. Each is loaded once, on first use, or all at start-up (:meth:`Runtime.warm`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from mice_exp.errors import UserError
from mice_exp.gate.loading import check_model
from mice_exp.gate.requests import call_too_long
from mice_exp.llm.backends import backend_of, check_backend
from mice_exp.llm.runner import Batch, Calls, Retrieval, Runner, reply_tokens
from mice_exp.llm.settings import LLMSettings, PromptSettings, RetrievalSettings
from mice_exp.paths import project_root

if TYPE_CHECKING:  # annotations only
    from mice_exp.data.records import Example


class Runtime:
    """A gate's LLM, runner and retrieval (``llm`` / ``prompt`` / ``retrieval``: the gate's settings as it runs
    them; ``models``: where converted weights are cached, default ``<project>/.cache/models``; ``loaded``: a
    generator the caller already holds, checked against ``spec`` now)."""

    def __init__(self, spec: Mapping[str, Any], llm: LLMSettings, prompt: PromptSettings,
                 retrieval: RetrievalSettings, pool: list, models: Path | None, loaded: Any = None) -> None:
        self.spec, self.llm_settings, self.prompt_settings, self.pool, self.models = spec, llm, prompt, pool, models
        self.retrieval = Retrieval.from_config(prompt, retrieval)
        self._backend: Any = None
        self._runner: Runner | None = None
        self._encoder: Any = None
        if loaded is not None:
            check_model(llm.name, spec.get("llm_stage") or {}, loaded)
        self._llm = loaded

    def backend(self) -> Any:
        """The LLM's backend (``llm.backend``), holding the generator it was given, if any."""
        if self._backend is None:
            check_backend(self.llm_settings)
            models = self.models or project_root() / ".cache" / "models"
            self._backend = backend_of(self.llm_settings, models, self._llm)
        return self._backend

    def llm(self) -> Any:
        """The generator, loaded (torch, or an engine, with the model) and checked against the saved gate once."""
        if self._llm is None:
            llm = self.backend().generator()
            check_model(self.llm_settings.name, self.spec.get("llm_stage") or {}, llm)
            self._llm = llm
        return self._llm

    def teacher(self) -> Any:
        """What teacher-forces a given call (:meth:`mice_exp.llm.backends.Backend.teacher`), on the checked LLM."""
        self.llm()
        return self.backend().teacher()

    def runner(self) -> Runner:
        """The runner of the gate's saved prompt settings and templates and its llm settings, built once with the
        LLM's tokenizer."""
        if self._runner is None:
            self._runner = Runner.from_config(self.prompt_settings, self.llm_settings, self.llm().tokenizer)
        return self._runner

    def encoder(self) -> Any:
        """The retrieval encoder, holding the demonstration pool's vectors (encoded once, on first use)."""
        if self._encoder is None:
            from mice_exp.data.retrieval import PoolEncoder  # loads torch, transformers

            self._encoder = PoolEncoder(self.retrieval.encoder(), [e.query for e in self.pool])
        return self._encoder

    def warm(self) -> None:
        """Load the LLM, the runner and the retrieval encoder now, not on the first call."""
        self.runner()
        if self.retrieval.k:
            self.encoder()

    def prompts(self, examples: Mapping[int, Example], split: str) -> tuple[Calls[int], dict[int, UserError]]:
        """The examples as the runner's calls (in ``split``), each prompt with demonstrations retrieved from the
        saved pool as the pipeline builds it, and the examples that have none, with why
        (:meth:`~mice_exp.llm.runner.Runner.prompts`)."""
        prompts, refused = {}, {}
        if examples:
            runner = self.runner()
            demos = self.retrieval.rank(examples.values(), self.pool, self.encoder)
            prompts, refused = runner.prompts(examples, demos, {e.id: e for e in self.pool})
        return Calls(examples, dict.fromkeys(prompts, split), prompts), refused

    def generate(self, calls: Calls[int]) -> Batch[int]:
        """Every call generated in the runner's batches (records and pooled arrays, in batch order)."""
        llm = self.llm()
        return self.runner().run(llm, calls, desc=f"gate {llm.name}")

    def force(self, calls: Calls[int], replies: Mapping[int, str], lens: bool, states: bool) -> Batch[int]:
        """Every call's reply (text) teacher-forced in the runner's batches, computing the lens and keeping the
        states only where asked; a reply past the context window refuses them all before any forward pass."""
        teacher, runner = self.teacher(), self.runner()
        tokens = {i: reply_tokens(teacher.tokenizer, replies[i]) for i in calls.prompts}
        if (i := runner.past_window(calls.prompts, tokens)) is not None:
            raise call_too_long(i, len(calls.prompts), len(tokens[i]), len(calls.prompts[i].ids),
                                self.llm_settings.name, runner.window)
        return runner.run(teacher, calls, tokens, lens=lens, states=states)
