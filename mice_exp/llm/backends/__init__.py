"""``llm.backend``: who generates a run's calls, and what else the LLM gives the run.

A backend is a :class:`Backend` subclass, named by ``llm.backend``: a module of this package (``hf``, ``vllm``,
``openai``) or any importable module path, whose ``BACKEND`` is the class. Before anything loads it says what
its calls come with (``internals``: hidden states and the logit lens), whether it has a transformers model to
replay a records file's states on (``replays``), what its source runner answers (``gives``, what each
confidence source :attr:`~mice_exp.llm.sources.Source.needs`), what it adds to the LLM stage's cache key and
how its sources are computed (their cache key), and what it needs installed; the run is refused in one line
where it asks for more. Loaded at most once, and only when something computes with it, it hands out its
generator (``generate(prompts, max_new_tokens, fmt)`` -> one :class:`~mice_exp.llm.generation.Generation`
per prompt, with ``name``, ``tokenizer``, ``n_layers``, ``hidden_size``), its forward model and its source
runner. A new backend is its module and the ``conf/llm`` entry (or override) naming it.

Module imports here stay light (no torch, no vllm): the checks run before any model loads.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from mice_exp.errors import UserError
from mice_exp.llm.settings import LLMSettings

#: What a source runner can answer (:attr:`Backend.gives`), and how a refusal names it.
ABILITIES = {"option_probs": "the next token's probabilities over the vocabulary (P(True)'s options)",
             "greedy": "greedy replies to a follow-up prompt",
             "samples": "k sampled replies to one prompt"}
PREFIX_METHOD = "shared-prefix-1"  # sources from a transformers model's own forward passes; part of their cache key
TEACHER_METHOD = "teacher-forced-1"  # replayed states from a transformers model's forward pass; part of their key


class Backend:
    """A conf/llm entry's engine (``settings``), loaded at most once and only when something computes with it: a
    run whose LLM stage, confidence sources and replayed states are all cached (or come from a records file)
    never loads a model. ``loaded``: a generator the caller already holds (tests, the gate)."""

    name: ClassVar[str]
    internals: ClassVar[bool] = True  # hidden states and the logit lens come with its calls
    replays: ClassVar[bool] = True  # it has a transformers model whose forward passes replay a records file's states
    gives: ClassVar[frozenset[str]] = frozenset(ABILITIES)  # what its source runner answers
    source_method: ClassVar[str] = PREFIX_METHOD  # how its sources are computed: part of their cache key
    replay_method: ClassVar[str] = TEACHER_METHOD  # how its teacher forces replies: part of the replays' cache key
    install: ClassVar[tuple[str, str] | None] = None  # a package beyond the main install, and how to get it

    def __init__(self, settings: LLMSettings, models: Path, loaded: Any = None) -> None:
        self.settings = settings  # the conf/llm entry
        self.models = models  # where weights are converted and cached (Paths.models)
        self._generator = loaded
        self._forward: Any = None

    @classmethod
    def check(cls, settings: LLMSettings) -> None:
        """The settings this backend reads, checked before anything loads: by default, its package installed."""
        if cls.install is not None and importlib.util.find_spec(cls.install[0]) is None:
            package, how = cls.install
            raise UserError(f"llm.backend={cls.name} needs the {package} package, which this Python "
                            f"({sys.executable}) lacks; expected it installed: {how}")

    def key(self) -> dict[str, Any]:
        """What the backend adds to the LLM stage's cache key: its name (engines differ in numerics)."""
        return {"backend": self.name}

    def load(self) -> Any:
        """Build the generator (the one costly step: weights, an engine, a connection)."""
        raise NotImplementedError

    def generator(self) -> Any:
        """What generates the LLM stage's calls, loaded on first use."""
        if self._generator is None:
            self._generator = self.load()
        return self._generator

    def forward_model(self) -> Any:
        """The transformers model (:class:`~mice_exp.llm.model.LLM`) whose forward passes the replayed states and
        the prefix source runner use, loaded once; a backend without one (:attr:`replays` false) refuses."""
        if not self.replays:
            raise UserError(f"llm.backend={self.name} has no model of its own to run forward passes on (replayed "
                            "hidden states); expected a backend with one (hf, vllm)")
        if self._forward is None:
            self._forward = self._own_forward_model()
        return self._forward

    def _own_forward_model(self) -> Any:
        from mice_exp.llm.model import load_hf  # loads torch

        return load_hf(self.settings, self.models)

    def teacher(self) -> Any:
        """What teacher-forces given replies after their prompts (:class:`~mice_exp.llm.teacher.Teacher`: a records
        file's states, another LLM's calls judged, a call the gate scores): by default the forward model's passes."""
        from mice_exp.llm.teacher import Teacher  # loads torch

        return Teacher(self.forward_model())

    def replay_suffix(self) -> str:
        """What a judged records cache folder's name adds for this backend's teacher: nothing for the transformers
        model's (the folders made before there were others keep their name), else its method."""
        return "" if self.replay_method == TEACHER_METHOD else f"-{self.replay_method}"

    def source_runner(self) -> Any:
        """What computes the confidence sources (:mod:`mice_exp.llm.sources`): by default the forward model's own
        passes, one call at a time with the prefix its prompts share encoded once."""
        from mice_exp.llm.prefix_sources import PrefixSources  # loads torch

        return PrefixSources(self.forward_model())

    @classmethod
    def refuse(cls, view: Any, estimators: Iterable[tuple[str, Any]], sources: Sequence[str],
               needs: Mapping[str, str], records: bool) -> None:
        """What the run asks that this backend cannot give, refused in one line before any model loads:
        hidden states or layer strings (generated: ``internals``; replayed for a records file: ``replays``)
        and confidence sources (``sources``: the run's; ``needs``: what each source asks a runner) whose needs
        its runner does not answer."""
        has_states = cls.replays if records else cls.internals
        if not has_states:
            if view.layers != "none" and not records:
                raise UserError(f"features={view.view} (layers={view.layers}) reads the LLM's layers, which "
                                f"llm.backend={cls.name} does not return; expected features=conf_only (raw "
                                "confidence and sources) or a backend with internals (hf, vllm)")
            if view.reads_states():
                raise UserError(f"features={view.view} reads hidden states, which llm.backend={cls.name} cannot "
                                "replay; expected a view on confidences or a backend with a model of its own "
                                "(hf, vllm)")
            for key, estimator in estimators:
                if estimator.needs().arrays:  # a probe, or a field correction on a representation
                    raise UserError(f"estimator {key} reads hidden states, which llm.backend={cls.name} does not "
                                    "return; expected an estimator on confidences or features, or a backend with "
                                    "internals (hf, vllm)")
        for name in sources:
            need = needs[name]
            if need not in cls.gives:
                raise UserError(f"sources.use=[{', '.join(sources)}]: {name} needs {ABILITIES[need]}, which "
                                f"llm.backend={cls.name} does not give; expected sources it can compute "
                                f"({', '.join(n for n, asks in needs.items() if asks in cls.gives) or 'none'})")


class SeededSources:
    """A source runner that seeds each call's samples apart (the batch's seed and the call's position in it), so a
    resumed batch draws what the first run drew; ``openai``'s and ``vllm``'s. ``call`` builds a call's asker."""

    def __init__(self, tokenizer: Any, eos: Sequence[int]) -> None:
        self.tokenizer, self.eos = tokenizer, eos
        self.seed = self.calls = 0

    def start_batch(self, seed: int) -> None:
        self.seed, self.calls = seed, 0

    def next_seed(self) -> int:
        self.calls += 1
        return self.seed * 10_000 + self.calls


def builtin() -> list[str]:
    """The backends of this package: its modules but the private ones."""
    return [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]


def backend_class(name: str) -> type[Backend]:
    """The class ``llm.backend`` names: ``BACKEND`` of this package's module ``name``, or of the module path
    ``name`` (``package.module``); one line when there is none."""
    path = f"{__name__}.{name}" if name in builtin() else name if "." in name else None
    try:
        found = getattr(importlib.import_module(path), "BACKEND", None) if path else None
    except ImportError as error:
        raise UserError(f"llm.backend={name!r} could not be imported ({error}); expected one of "
                        f"{', '.join(builtin())} or an importable module path") from None
    if not (isinstance(found, type) and issubclass(found, Backend)):
        raise UserError(f"llm.backend={name!r}; expected one of {', '.join(builtin())} or an importable module "
                        "path (package.module) whose BACKEND is a mice_exp.llm.backends.Backend subclass")
    return found


def check_backend(llm: LLMSettings, generates: bool = True) -> type[Backend]:
    """``llm.backend``'s class, with the settings it generates with checked before anything loads (a run on a
    records file ``generates`` nothing)."""
    cls = backend_class(str(llm.backend))
    if generates:
        cls.check(llm)
    return cls


def backend_of(llm: LLMSettings, models: Path, loaded: Any = None) -> Backend:
    """The backend a ``conf/llm`` entry names (not loaded; ``loaded``: a generator the caller already holds)."""
    return backend_class(str(llm.backend))(llm, models, loaded)


def load_llm(llm: LLMSettings, models: Path) -> Any:
    """The generator of the backend a ``conf/llm`` entry names, checked and loaded now (tests, benchmarks, the gate)."""
    check_backend(llm)
    return backend_of(llm, models).generator()
