"""The ``llm``, ``prompt`` and ``retrieval`` config groups as frozen objects, built once from the config (the
pipeline's builder, a gate's load, a stage worker's start) and handed down; nothing reads their keys elsewhere
(``tests/test_architecture.py`` greps for it).

Each keeps the mapping it was built from: :meth:`Settings.as_dict` gives it back unchanged, for everything that
hashes or writes the group (the LLM stage's cache key, a records header, MLflow params, ``gate.json``), so a
setting read through the object changes no key and no published file. What the groups imply is derived here once:
the prompt budget, whether tools are shown as schemas, the reply format, the parts of a cache key.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Mapping, TypeVar

from mice_exp.errors import UserError
from mice_exp.llm.precision import resolve_dtype
from mice_exp.llm.records import PROMPT_DEFAULTS
from mice_exp.llm.toolcall import REACT, CallFormat, call_format

#: ``prompt.tools``: the data set's own tool text, or JSON schemas.
TOOL_MODES = ("text", "schemas")
#: ``prompt.demo_tools``: the demonstrations' tools listed with the query's, or each in its demonstration's turn.
DEMO_TOOLS = ("pooled", "per_demo")
#: What a conf/llm entry without ``llm.backend`` generates with (:mod:`mice_exp.llm.backends`).
DEFAULT_BACKEND = "hf"
#: The ``llm`` settings the LLM stage's cache key hashes (where given), beside the device and the dtype it resolves.
LLM_KEYS = ("source", "dtype", "batch_size", "max_new_tokens", "context_window", "store_token_states")

S = TypeVar("S", bound="Settings")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """One config group's settings: a field per key (a key no field names is refused, one missing that has no
    default too), and the mapping they came from (``given``, read back by :meth:`as_dict` only)."""

    group: ClassVar[str]
    given: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_config(cls: type[S], mapping: Mapping[str, Any]) -> S:
        """The settings of a ``conf/<group>`` node (a plain mapping: the resolved config's, a saved gate's)."""
        names = [f.name for f in fields(cls) if f.name != "given"]
        for key in sorted(set(mapping) - set(names)):
            raise UserError(f"{cls.group}.{key}={mapping[key]!r} is not a setting: nothing reads it; expected one of "
                            f"{cls.group}.{'|'.join(sorted(names))}")
        for f in fields(cls):
            if f.name != "given" and f.name not in mapping and f.default is MISSING and f.default_factory is MISSING:
                raise UserError(f"{cls.group}.{f.name} is missing; expected a conf/{cls.group} entry that sets it")
        given = copy.deepcopy(dict(mapping))
        return cls(given=given, **copy.deepcopy(given))

    def as_dict(self) -> dict[str, Any]:
        """The mapping the settings were built from, as a new plain dict: what a key hashes and a file records."""
        return copy.deepcopy(self.given)

    def overridden(self: S, **changes: Any) -> S:
        """The same settings with ``changes`` (a gate's device and batch size, a stage worker's shard)."""
        return type(self).from_config({**self.given, **changes})


@dataclass(frozen=True, kw_only=True)
class LLMSettings(Settings):
    """``conf/llm``: the model, where and how it runs, its budgets, the stage's sharding and records file, and the
    OpenAI-compatible endpoint's settings (``llm.backend=openai``)."""

    group: ClassVar[str] = "llm"
    name: str
    display: str | None = None
    source: Mapping[str, Any]
    backend: str = DEFAULT_BACKEND
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int
    max_new_tokens: int
    context_window: int
    store_token_states: bool = False
    shards: int = 1
    shard: int | None = None
    records: str | None = None
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 600
    max_retries: int = 2

    @property
    def title(self) -> str:
        """How tables and headers name the LLM: its display name, else its name."""
        return self.name if self.display is None else self.display

    @property
    def prompt_budget(self) -> int:
        """The tokens a prompt may take: the context window less the reply's budget, for the stage, the replay,
        the judge and the gate alike."""
        return int(self.context_window) - int(self.max_new_tokens)

    @property
    def resolved_dtype(self) -> str:
        """The dtype ``auto`` picks on the configured device (any other dtype as given)."""
        return resolve_dtype(self.dtype, self.device)

    def pinned(self) -> LLMSettings:
        """These settings with ``dtype`` as it resolves on the device: what a run's params, config hash and gate
        record (``auto`` would say nothing about what ran)."""
        return self.overridden(dtype=self.resolved_dtype)

    def key(self, device: str) -> dict[str, Any]:
        """The LLM's part of the stage's cache key on ``device`` (a device type): the :data:`LLM_KEYS` given, the
        device and the dtype resolved there."""
        return ({k: copy.deepcopy(self.given[k]) for k in LLM_KEYS if k in self.given}
                | {"device": device, "dtype": resolve_dtype(self.dtype, device)})

    def weights(self) -> dict[str, Any]:
        """What decides the numbers a forward pass gives: the model's source and the resolved dtype (the keys of
        replayed states and of multiple-choice scores)."""
        return {"source": copy.deepcopy(self.source), "dtype": self.resolved_dtype}


@dataclass(frozen=True, kw_only=True)
class PromptSettings(Settings):
    """``conf/prompt``: the templates, how tools and demonstrations are shown, the reply format, how many
    demonstrations and from where."""

    group: ClassVar[str] = "prompt"
    k_demos: int
    template: str
    system: str
    tools: str = "text"
    demo_tools: str = "pooled"
    format: str = REACT.name
    chat_template: bool = True
    demo_pool: str = "all"
    demo_mix: str = "similar"
    no_call_note: str | None = None

    def __post_init__(self) -> None:
        if self.tools not in TOOL_MODES:
            raise UserError(f"prompt.tools={self.tools!r}; expected one of {', '.join(TOOL_MODES)}")
        if self.demo_tools not in DEMO_TOOLS:
            raise UserError(f"prompt.demo_tools={self.demo_tools!r}; expected one of {', '.join(DEMO_TOOLS)}")
        call_format(self.format)  # an unknown reply format: one line now

    @property
    def schemas(self) -> bool:
        """Tools shown as JSON function schemas (``prompt.tools=schemas``), else as the data set's own text."""
        return self.tools == "schemas"

    @property
    def per_demo(self) -> bool:
        """Each demonstration's tools in its own turn (``prompt.demo_tools=per_demo``)."""
        return self.demo_tools == "per_demo"

    @property
    def fmt(self) -> CallFormat:
        """The reply format: parser, stopping rule, how demonstrations are written (``prompt.format``)."""
        return call_format(self.format)

    def key(self, defaults: Mapping[str, Any] = PROMPT_DEFAULTS) -> dict[str, Any]:
        """The prompt settings a cache key hashes: those at their ``defaults`` value left out (the keys made before
        a setting existed stay the same)."""
        return {k: copy.deepcopy(v) for k, v in self.given.items() if not (k in defaults and v == defaults[k])}


@dataclass(frozen=True, kw_only=True)
class RetrievalSettings(Settings):
    """``retrieval``: the sentence encoder demonstrations are retrieved with (None: the installed MiniLM) and its
    device."""

    group: ClassVar[str] = "retrieval"
    model: str | None = None
    device: str = "cpu"
