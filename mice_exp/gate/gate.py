"""The deployable gate: a new query -> the LLM's tool call, P(call is correct), execute or abstain.

A query goes through the pipeline's own steps, in the same order and with the same objects: demonstrations
retrieved from the saved pool (:class:`mice_exp.llm.runner.Retrieval`), then the LLM stage's own runner
(:class:`mice_exp.llm.runner.Runner`: the prompt within the prompt budget, the stage's fixed batches, generation
with capture, records and pooled arrays; :mod:`mice_exp.gate.runtime` loads it with the LLM), held in memory as a
:class:`mice_exp.llm.records.StageOutput` that the run's fitted feature view, saved with the gate, transforms
exactly as it transformed the run's records, and the estimator's ``predict_proba`` (:mod:`mice_exp.gate.
probability`). The call is executed iff p > tau, tau being the minimum-Bayes-risk threshold of the saved risk
setting (MICE Eq. 2; :mod:`mice_exp.gate.decisions`). Opening and checking a saved gate is
:mod:`mice_exp.gate.loading`'s, reading a batch of chat requests :mod:`mice_exp.gate.requests`'.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from mice_exp.errors import UserError
from mice_exp.gate import decisions, probability
from mice_exp.gate.artifact import check_templates, risk_entry
from mice_exp.gate.chat import Decision, Messages, check_tau
from mice_exp.gate.loading import open_saved
from mice_exp.gate.queries import parse_query, query_id
from mice_exp.gate.registry import model_name
from mice_exp.gate.requests import chat_examples, proposed_replies, refuse_unprompted
from mice_exp.gate.runtime import Runtime
from mice_exp.llm.records import StageOutput
from mice_exp.llm.runner import Calls, Runner
from mice_exp.llm.settings import LLMSettings, PromptSettings, RetrievalSettings

if TYPE_CHECKING:  # pragma: no cover
    from mice_exp.data.records import Example
    from mice_exp.features import FeatureSet
    from mice_exp.llm.prompt import PromptBuilder

SPLIT = "gate"  # the split name of the gate's records (the feature view ignores it)


class Gate:
    """A saved pipeline that answers queries; build it with :meth:`load`."""

    def __init__(self, folder: Path, spec: dict[str, Any], estimator: Any, view: Any, pool: list, *, llm: Any = None,
                 device: str | None = None, batch_size: int | None = None, engine: Mapping[str, Any] | None = None,
                 models: Path | None = None, keep: Any = None) -> None:
        self.folder, self.spec, self.estimator, self.pool = Path(folder), spec, estimator, pool
        self.view = view  # the run's fitted feature view; None in a gate saved before gates kept it
        # every model the gate runs goes where it is told: the LLM, the view's own (BERTScore's), the retrieval's
        self.device = device
        where = {"device": device} if device else {}
        runs = where | dict(engine or {}) | ({"batch_size": int(batch_size)} if batch_size else {})
        self.llm_settings = LLMSettings.from_config({**spec["llm"], **runs})
        self.retrieval_settings = RetrievalSettings.from_config({**spec["retrieval"], **where})
        if device and view is not None:
            self.view = view.on_device(device)
        templates = {role: str(self.folder / rel) for role, rel in spec["templates"].items()}
        # the saved copies of the templates, not today's shipped files
        self.prompt_settings = PromptSettings.from_config({**spec["prompt"], **templates})
        check_templates(self.folder, spec, self.prompt_settings.tools)
        self.runtime = Runtime(spec, self.llm_settings, self.prompt_settings, self.retrieval_settings, pool, models,
                               llm)
        self._keep = keep  # the temporary download of an MLflow source lives as long as the gate
        self._lock = threading.Lock()  # one generation at a time: check_batch may be called from many threads
        # the last call's parts in seconds: prepare_s, generate_s or forward_s and records_s, features_s, total_s
        self.timing: dict[str, float] = {}

    @classmethod
    def load(cls, source: str | Path, *, expect: Mapping[str, Any] | None = None,
             parts: Sequence[str] = ("llm", "features"), llm: Any = None, device: str | None = None,
             batch_size: int | None = None, engine: Mapping[str, Any] | None = None, models: Path | None = None,
             tracking: Mapping[str, Any] | str | None = None, root: Path | None = None) -> Gate:
        """Load a gate folder, or the folder behind ``runs:/<id>/gate`` / ``models:/<name>/<version>``.

        Args:
            expect: a pipeline config; its ``llm`` / ``features`` (those named in ``parts``) must be
                the gate's, else a one-line UserError refuses it before anything heavy loads.
            llm: an already loaded :class:`mice_exp.llm.model.LLM` to use (else loaded on first use).
            device, batch_size: override where every model of the gate runs (its LLM, BERTScore's encoder, the
                retrieval encoder) and in what batches the LLM runs; ``engine``: llm settings of what runs it
                (``{"backend": "vllm"}``: :data:`~mice_exp.gate.artifact.ENGINE_SETTINGS`). None of them changes
                the gate's identity.
            models: the model cache (``Paths.models``) the LLM is loaded or converted into.
            tracking: the ``tracking`` config (or a tracking URI) for MLflow sources; default: the
                project's embedded store.
        """
        saved = open_saved(source, expect, parts, tracking, root)
        return cls(saved.folder, saved.spec, saved.estimator, saved.view, saved.pool, llm=llm, device=device,
                   batch_size=batch_size, engine=engine, models=models, keep=saved.keep)

    @property
    def tau(self) -> float:
        return float(self.spec["risk"]["tau"])

    @property
    def columns(self) -> list[str]:
        return list(self.spec["columns"])

    @property
    def model_name(self) -> str:
        """The gate's name (its default registered-model name): what ``mice-exp serve`` serves it as."""
        s = self.spec
        return model_name(self.llm_settings.name, s["features"].get("name", s["features"]["view"]),
                          s["estimator"].get("key") or s["estimator"]["class"].rsplit(".", 1)[1])

    def set_risk(self, risk_cfg: Mapping[str, Any]) -> None:
        """Decide at another risk setting (a ``conf/risk`` entry); the probabilities do not change."""
        self.spec["risk"] = risk_entry(risk_cfg)

    def describe(self) -> str:
        s = self.spec
        return (f"{self.llm_settings.title} | features {s['features'].get('name')} | "
                f"{s['estimator'].get('name') or s['estimator']['class'].rsplit('.', 1)[1]} | "
                f"risk {s['risk']['name']} (tau={self.tau:g}) | demo pool {len(self.pool)}")

    def backend(self) -> Any:
        """The gate's LLM backend (:meth:`Runtime.backend <mice_exp.gate.runtime.Runtime.backend>`)."""
        return self.runtime.backend()

    def llm(self) -> Any:
        """The generator, loaded and checked against the saved gate once."""
        return self.runtime.llm()

    def teacher(self) -> Any:
        """What teacher-forces a given call, on the checked LLM."""
        return self.runtime.teacher()

    def runner(self) -> Runner:
        """What prompts, batches and records every request (:class:`~mice_exp.llm.runner.Runner`)."""
        return self.runtime.runner()

    def builder(self) -> PromptBuilder:
        """The gate's :class:`~mice_exp.llm.prompt.PromptBuilder`: its runner's."""
        return self.runner().builder

    def warm(self) -> None:
        """Load the LLM, the runner and the retrieval encoder now, not on the first check (a server pays it at
        start-up, and a model that cannot load fails there)."""
        self.runtime.warm()

    def encoder(self) -> Any:
        """The retrieval encoder, holding the demonstration pool's vectors."""
        return self.runtime.encoder()

    def features(self, stage: StageOutput) -> FeatureSet:
        """The feature rows of an LLM-stage output through the run's fitted view (:func:`~mice_exp.gate.
        probability.features`)."""
        return probability.features(self.view, self.spec, self.device, stage)

    def reads(self) -> tuple[bool, bool]:
        """Whether the view and estimator read the lens' layer strings and the hidden-state arrays: all that a
        scored call's pass computes (:func:`~mice_exp.gate.probability.reads`)."""
        return probability.reads(self.view, self.estimator)

    def probabilities(self, fs: FeatureSet) -> np.ndarray:
        """P(correct) for the rows of a FeatureSet built with the gate's feature view."""
        return probability.probabilities(self.estimator, self.columns, fs)

    def decide(self, queries: Sequence[Any], places: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """One answer per query, in order: ``{id, call: {api, args}, text, probability, decision, tau,
        raw_confidence, arguments, arguments_error, parse_error, error}``; ``decision`` is "execute"
        (p > tau) or "abstain"; ``arguments`` maps each top-level argument to the product of its value
        tokens' probabilities ({} and ``arguments_error`` saying why for an unparseable call); a query
        that cannot be run gets ``error`` (and no decision) while the others still run."""
        start = time.perf_counter()
        answers: list[dict[str, Any] | None] = [None] * len(queries)
        ids = [query_id(q, i) for i, q in enumerate(queries)]
        examples = {}
        for i, item in enumerate(queries):
            try:
                examples[i] = parse_query(item, i, places[i] if places else None)
            except UserError as error:
                answers[i] = decisions.failed(ids[i], str(error), self.tau)
        calls, refused = self._prompts(examples)
        for i, error in refused.items():
            answers[i] = decisions.failed(ids[i], str(error).replace(examples[i].id, f"query {ids[i]!r}"), self.tau)
        self.timing = {"prepare_s": time.perf_counter() - start}
        if calls.prompts:
            records, p = self._records(calls)
            for i, record, prob in zip(sorted(calls.prompts), records, p):
                answers[i] = self._answer(ids[i], record, float(prob))
        self.timing["total_s"] = time.perf_counter() - start
        return answers  # type: ignore[return-value]

    def check(self, messages: Messages, tools: Sequence[dict[str, Any]], *, tau: float | None = None) -> Decision:
        """The gate's :class:`~mice_exp.gate.chat.Decision` on one OpenAI-style chat request: ``messages``
        ending with the user's turn, ``tools`` as function schemas; ``tau`` decides at another threshold
        than the saved risk's. Bad input is an :class:`~mice_exp.gate.chat.InvalidRequest`."""
        return self.check_batch([(messages, tools)], tau=tau)[0]

    def check_batch(self, requests: Sequence[tuple[Messages, Sequence[dict[str, Any]]]], *,
                    tau: float | None = None) -> list[Decision]:
        """:meth:`check` for many ``(messages, tools)`` pairs, generated in the LLM stage's batches; one bad
        request refuses the batch (its error names it). One batch runs at a time (a lock around the LLM)."""
        if not requests:
            return []
        start = time.perf_counter()
        tau = self.tau if tau is None else check_tau(tau)
        examples = self._chat_examples(requests)
        with self._lock:
            calls = self._request_prompts(examples, len(requests))
            self.timing = {"prepare_s": time.perf_counter() - start}  # this call's parts only, as score_batch's
            records, p = self._records(calls)
            generated = {i: r["text"] for i, r in zip(sorted(calls.prompts), records)}
            records, p = self._canonical(calls, records, p)
            self.timing["total_s"] = time.perf_counter() - start
        return [replace(self._decision(record, float(prob), tau, examples[i].tool_names), text=generated[i])
                for i, record, prob in zip(sorted(calls.prompts), records, p)]

    def _canonical(self, calls: Calls[int], records: list[dict], p: np.ndarray) -> tuple[list[dict], np.ndarray]:
        """The generated calls that parse, scored as :meth:`score` scores them: rendered canonically and
        teacher-forced (a second pass where the model wrote another layout), so that the gate's probability of its
        own call is the one a host that hands the call back gets, and the one its estimator was fitted on."""
        fmt, at = self.builder().fmt, {i: n for n, i in enumerate(sorted(calls.prompts))}
        replies = {i: fmt.canonical(records[n]["pred_api"], records[n]["pred_args"]) for i, n in at.items()
                   if isinstance(records[n]["pred_args"], dict) and records[n]["pred_api"]}
        replies = {i: text for i, text in replies.items() if text != records[at[i]]["text"]}
        if not replies:
            return records, p
        again, q = self._records(calls.only(replies), replies)
        records, p = list(records), p.copy()
        for i, record, prob in zip(sorted(replies), again, q):
            records[at[i]], p[at[i]] = record, prob
        return records, p

    def score(self, messages: Messages, tools: Sequence[dict[str, Any]], call: Mapping[str, Any], *,
              tau: float | None = None) -> Decision:
        """The gate's :class:`~mice_exp.gate.chat.Decision` on a tool call someone else proposed (an agent's model,
        a user): ``call`` in OpenAI's shape (:func:`~mice_exp.gate.chat.read_call`), written in the gate's reply
        format as the reply to the request's prompt and teacher-forced through the gate's LLM in one forward
        pass (:func:`mice_exp.llm.teacher.score_replies`: no decoding; layers and lens only where the view or
        estimator reads them, :meth:`reads`), then the same records, features, estimator and threshold as
        :meth:`check`. For the gate's own greedy call it gives :meth:`check`'s probability up to float rounding. A
        call to a tool not offered, or with arguments that are not JSON or do not match the tool's schema, is still
        scored but never executed (``reason`` says why)."""
        return self.score_batch([(messages, tools, call)], tau=tau)[0]

    def score_batch(self, requests: Sequence[tuple[Messages, Sequence[dict[str, Any]], Mapping[str, Any]]], *,
                    tau: float | None = None) -> list[Decision]:
        """:meth:`score` for many ``(messages, tools, call)`` triples, teacher-forced in the LLM stage's batches
        (one forward pass each); one bad request refuses the batch (its error names it)."""
        start = time.perf_counter()
        tau = self.tau if tau is None else check_tau(tau)
        examples = self._chat_examples([(m, t) for m, t, _ in requests])
        replies, problems = proposed_replies(requests, self.builder().fmt)
        with self._lock:
            calls = self._request_prompts(examples, len(requests))
            self.timing = {"prepare_s": time.perf_counter() - start}
            scored = [i for i in sorted(calls.prompts) if problems[i] is None]
            records, p = self._records(calls.only(scored), replies) if scored else ([], [])
            self.timing["total_s"] = time.perf_counter() - start
        decided = {i: self._decision(record, float(prob), tau, examples[i].tool_names)
                   for i, record, prob in zip(scored, records, p)}
        return [decided.get(i) or decisions.denied(problems[i], replies[i], tau, len(calls.prompts[i].ids))
                for i in sorted(calls.prompts)]

    def _chat_examples(self, requests: Sequence[tuple[Messages, Any]]) -> dict[int, Example]:
        """Each ``(messages, tools)`` request as the :class:`Example` the prompt builder takes."""
        return chat_examples(requests, self.prompt_settings.schemas)

    def _request_prompts(self, examples: Mapping[int, Example], n_requests: int) -> Calls[int]:
        """:meth:`_prompts` for chat requests, where a request without a prompt refuses the batch."""
        calls, refused = self._prompts(examples)
        refuse_unprompted(refused, n_requests, self.llm_settings.name)
        return calls

    def _prompts(self, examples: Mapping[int, Example]) -> tuple[Calls[int], dict[int, UserError]]:
        """The examples as the runner's calls with their prompts, and those that have none, with why."""
        return self.runtime.prompts(examples, SPLIT)

    def _records(self, calls: Calls[int], replies: Mapping[int, str] | None = None) -> tuple[list[dict], np.ndarray]:
        """The calls generated in the runner's batches (or with ``replies``, those teacher-forced: same batches, same
        records, computing only what the gate reads), then their probabilities; rows in index order."""
        ran = self.runtime.generate(calls) if replies is None else self.runtime.force(calls, replies, *self.reads())
        self.timing.update(ran.seconds)  # generate_s, or forward_s (the teacher's passes) and records_s
        llm, tick = self.llm(), time.perf_counter()
        stage = StageOutput(records=ran.records, info={"n_layers": llm.n_layers, "hidden_size": llm.hidden_size},
                            key="gate", pooled=ran.arrays)
        p = self.probabilities(self.features(stage))
        self.timing["features_s"] = time.perf_counter() - tick
        row = {key: n for n, key in enumerate(ran.keys)}
        keep = [row[i] for i in sorted(calls.prompts)]
        return [ran.records[n] for n in keep], p[keep]

    def _decision(self, record: Mapping[str, Any], p: float, tau: float, tools: Sequence[str]) -> Decision:
        return decisions.decision(record, p, tau, tools, self.builder().fmt, decisions.argument_rule(self.spec))

    def _answer(self, qid: Any, record: Mapping[str, Any], p: float) -> dict[str, Any]:
        return decisions.answer(qid, record, p, self.tau, self.builder().fmt, decisions.argument_rule(self.spec))
