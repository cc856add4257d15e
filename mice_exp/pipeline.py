"""One run's objects, built once from its resolved config and handed down: :meth:`Pipeline.from_config`.

The data set (selected once, on first use), the LLM stage with its backend (loaded at most once, and only
when something it would compute is not cached), the feature view, the protocol, the study of estimators
and the tracker's settings. As in lightning-hydra-template's ``train.py``, objects go down, not the
config: :mod:`mice_exp.run`, the gate (:mod:`mice_exp.gate.build`) and the ``records`` / ``inspect``
commands build a pipeline, and nothing below them reads the config.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from mice_exp.compose import as_plain
from mice_exp.config import check_config, check_data, settle_sources, used_baselines
from mice_exp.data import Example, Selection, demo_pool, make_dataset
from mice_exp.discover import class_path
from mice_exp.errors import UserError
from mice_exp.llm.backends import backend_of, check_backend
from mice_exp.llm.records import ARRAYS, Record, StageOutput
from mice_exp.llm.replay import replay_activations
from mice_exp.llm.sources import SOURCES, stage_sources
from mice_exp.llm.settings import LLMSettings, PromptSettings, RetrievalSettings
from mice_exp.llm.stage import LLMStage
from mice_exp.needs import RAW
from mice_exp.paths import Paths, paths_from
from mice_exp.tracking import hydra_tags, schema, tracked_run
from mice_exp.tracking.dashboard import run_name
from mice_exp.tracking.sweeps import config_hash

if TYPE_CHECKING:  # annotations only
    from mice_exp.estimation import Candidate, Study
    from mice_exp.features import FeatureSet
    from mice_exp.features.arguments import ArgumentScores
    from mice_exp.protocols import Outcome, Protocol


def check_needs(use: Sequence[str] | None, features: str, view: Any, candidates: Sequence[Candidate]) -> list[str]:
    """What the view (``features``) and each estimator declare they read (:class:`~mice_exp.needs.Needs`) is
    what the config provides: every LLM-stage array exists and every confidence source is computed; returns
    ``sources.use`` settled (:func:`~mice_exp.config.settle_sources`: null is what they read)."""
    readers = [(f"features={features} (features.sources)", view.needs()),
               *((f"estimator {c.key}", c.needs) for c in candidates)]
    for who, needs in readers:
        for array in sorted(needs.arrays - set(ARRAYS)):
            raise UserError(f"{who} reads representation={array!r}, which the LLM stage does not keep; "
                            f"expected an LLM-stage array: {', '.join(ARRAYS)}")
    return settle_sources(use, readers)


@dataclass
class Pipeline:
    """Every object one run uses (:meth:`from_config`), and the steps that hand each one's output to the next."""

    config: dict[str, Any]  # resolved and checked: logged as the run's params, hashed, saved with its gate
    paths: Paths
    stage: LLMStage  # the data set, the prompt, the LLM settings and the lazily loaded backend
    sources: Mapping[str, Any]  # conf/sources: the confidence sources beyond raw probability
    feature_settings: Mapping[str, Any]  # conf/features: the view's node, what a gate saves to rebuild it
    view: Any  # the unfitted feature view (conf/features)
    protocol: Protocol
    study: Study  # the run's estimator, its reference rows and how rows are scored
    tracking: Mapping[str, Any]  # conf/tracking
    gate: Mapping[str, Any]  # conf/gate: whether and where the fitted estimator is saved as a gate
    estimates: bool  # stage=all: the estimation follows the LLM stage
    force: bool  # re-run a job MLflow already holds FINISHED
    actor: str | None = None  # whose calls: None = the LLM's own, else an actor's judged by the LLM (llm.records)
    read: StageOutput | None = field(default=None, repr=False)  # the records file, once :meth:`check_inputs` read it

    @classmethod
    def from_config(cls, cfg: Any, paths: Paths | None = None, llm: Any = None) -> Pipeline:
        """Resolve ``cfg`` and check its values (:func:`~mice_exp.config.check_config`: one line for any bad one),
        keep only the ``baselines`` it reads (so the params, the config hash and the saved config describe what
        ran), pin ``llm.dtype=auto``, build every object once, then check the built objects against each other
        (:meth:`check`); ``llm``: a backend the caller already holds (tests, a gate's)."""
        cfg = as_plain(cfg)
        check_config(cfg)  # a bad value is refused before the seconds of imports below
        from mice_exp.estimation import Study  # loads sklearn, joblib
        from mice_exp.features import make_view  # loads sklearn
        from mice_exp.protocols import make_protocol  # loads matplotlib, sklearn

        named = [*cfg["compare_with"], *(cfg["protocol"].get("estimators") or [])]
        baselines = cfg.get("baselines") or {}
        settings = LLMSettings.from_config(cfg["llm"])
        if not settings.records:  # the dtype auto picks, in the params, the config hash and the gate
            settings = settings.pinned()
        used = [k for k in used_baselines(cfg["estimator"], baselines, named) if k in baselines]
        cfg = {**cfg, "llm": settings.as_dict(), "baselines": {k: baselines[k] for k in used}}  # the caller's unchanged
        paths = paths or paths_from(cfg["paths"])
        stage = LLMStage(make_dataset(cfg["dataset"]), PromptSettings.from_config(cfg["prompt"]), settings,
                         RetrievalSettings.from_config(cfg["retrieval"]), paths,
                         backend_of(settings, paths.models, llm))
        protocol = make_protocol(cfg["protocol"])
        pipeline = cls(config=cfg, paths=paths, stage=stage, sources=cfg["sources"], feature_settings=cfg["features"],
                       view=make_view(cfg["features"], paths.features, int(cfg["seed"])), protocol=protocol,
                       study=Study.from_config(cfg, protocol.estimators), tracking=cfg["tracking"],
                       gate=cfg.get("gate") or {},
                       estimates=cfg.get("stage", "all") == "all", force=bool(cfg.get("force")),
                       actor=cfg.get("actor"))
        sources = {**pipeline.sources, "use": pipeline.check()}  # settled: what the run computes, logs and hashes
        return replace(pipeline, sources=sources, config={**cfg, "sources": sources})

    def candidates(self) -> list[Candidate]:
        """Every estimator the run fits: its own, the reference rows and the protocol's (sample efficiency)."""
        return [self.study.main, *self.study.references, *self.study.named.values()]

    def check(self) -> list[str]:
        """The built objects checked against each other before anything loads or runs (one line each): what the
        view and every estimator read is provided (:func:`check_needs`), the backend gives the internals and the
        sources they read (:meth:`~mice_exp.llm.backends.Backend.refuse`), and the gate this run saves will trust
        the view's and the estimator's classes. Returns ``sources.use`` settled (null: what they read)."""
        self.view.validate()
        use = check_needs(self.sources["use"], self.feature_settings["name"], self.view, self.candidates())
        records = bool(self.stage.llm.records)  # nothing generates: the backend need not be installed
        check_backend(self.stage.llm, generates=not records)
        self.stage.backend.refuse(self.view, [(c.key, c.estimator) for c in self.candidates()], use,
                                  {name: source.needs for name, source in SOURCES.items()}, records)
        if self.saves_gate():
            self.check_trusted()
        return use

    def saves_gate(self) -> bool:
        """Whether a run of this pipeline saves a gate: ``gate.save``, one fitted model (holdout) and inputs a gate
        rebuilds for a new query (:meth:`gate_unsupported`)."""
        return (self.estimates and bool(self.gate.get("save", True)) and self.protocol.one_model
                and self.gate_unsupported() is None)

    def gate_unsupported(self) -> str | None:
        """Why a gate cannot rebuild this pipeline's inputs for a new query (None when it can). Every feature view
        can: the gate keeps the fitted one."""
        main = self.study.main
        if main.estimator.gate_refuses:
            return f"estimator={main.key}: {main.estimator.gate_refuses}"
        if main.needs.arrays:  # a field correction's representation was refused above, with its base
            return (f"estimator={main.key}: it reads the LLM's {', '.join(sorted(main.needs.arrays))} hidden states, "
                    "which a gate does not keep for new queries yet; expected an estimator on the confidence or the "
                    "feature view")
        if main.source != RAW:
            return (f"estimator.source={main.source!r}: a gate computes the raw confidence only, not the "
                    f"{main.source} source (mice_exp.llm.sources); expected an estimator on the raw confidence or the "
                    "feature view")
        if self.view.sources:
            return (f"features.sources={list(self.view.sources)}: a gate does not compute extra confidence "
                    "sources; expected features without sources")
        return None

    def check_trusted(self) -> None:
        """The view's and the estimator's classes are ones a gate loads (found in their packages): checked before a
        run that saves a gate, since a class found nowhere would otherwise fail at the save, after the run."""
        from mice_exp.estimators import estimator_classes  # loads sklearn, scipy
        from mice_exp.features import view_classes  # loads sklearn

        for obj, classes, where, package in ((self.view, view_classes(), "features._target_", "mice_exp.features"),
                                             (self.study.main.estimator, estimator_classes(),
                                              "estimator.model._target_", "mice_exp.estimators")):
            if type(obj) not in classes:
                raise UserError(f"{where}={class_path(obj)}: a gate loads only the classes defined in a module of "
                                f"{package} or exported by it, so this run's gate could not be saved; expected the "
                                f"class in {package} (or gate.save=false)")

    # -- the LLM stage
    def check_data(self) -> Selection:
        """The run's examples, checked for what only the data can tell (:func:`mice_exp.config.check_data`)."""
        selection = self.stage.selection
        check_data(selection, self.stage.dataset.split, self.stage.prompt.schemas, self.protocol.name, self.estimates)
        if self.estimates:  # what the view and protocol need of the training calls, each saying it
            n_train = sum(split == "train" for split in selection.splits.values())
            self.view.check_training_calls(n_train)
            self.protocol.check_training_calls(n_train)
        return selection

    def check_inputs(self) -> None:
        """What the data set and a records file (``llm.records``, read here once) can refuse, so that its one
        line comes before the run's MLflow run opens and no empty run is left."""
        self.check_data()
        llm = self.stage.llm
        if self.actor is not None and self.stage.records_path is None:
            raise UserError(f"actor={self.actor}: a run reads an actor's calls judged by llm={llm.name} "
                            f"from a records file; expected llm.records=experiments/records/actors/"
                            f"{self.stage.dataset.name}-{self.actor}-judged-by-{llm.name}.jsonl.gz "
                            f"(written by `mice-exp records llm={llm.name} actor={self.actor}`)")
        if self.stage.records_path is not None:
            self.read = self.stage.output(self.view.record_fields)
            wrote = self.read.info.get("actor")
            if self.actor is not None and wrote != self.actor:
                raise UserError(f"actor={self.actor}, but llm.records={llm.records} holds "
                                f"{'the calls of ' + wrote if wrote else llm.name + ' own calls'}; "
                                f"expected the records of actor={self.actor} judged by llm={llm.name}")
            if self.estimates:
                self.confidence_sources(self.read)  # sources.use the file does not hold

    def stage_output(self) -> StageOutput:
        """The LLM stage's records, computed or read (:meth:`LLMStage.output`); for a records file whose view or
        estimators read hidden states, with those states replayed before anything reads them."""
        output, self.read = self.read, None
        if output is None:
            self.check_data()
            output = self.stage.output(self.view.record_fields)
        if output.folder is None and output.pooled is None and self.reads_states():
            output.pooled = replay_activations(self.stage, output)
        return output

    def reads_states(self) -> bool:
        """Whether the estimation reads the LLM's hidden states: the view's layers, a probe's or a field
        correction's representation (the sample-efficiency protocol's estimators included)."""
        return self.estimates and (self.view.reads_states() or any(c.needs.arrays for c in self.candidates()))

    def confidence_sources(self, output: StageOutput) -> dict[str, np.ndarray]:
        """``sources.use`` for every record: from the records file, or computed once and cached beside the
        LLM stage (only a missing one loads the LLM)."""
        names = list(self.sources["use"])
        if not names:
            return {}
        if output.folder is None:
            missing = [n for n in names if n not in output.sources]
            if missing:
                raise UserError(f"sources.use={names}: the records file {self.stage.llm.records} holds "
                                f"{sorted(output.sources) or 'no sources'}, not {missing}; expected sources it holds "
                                "(compute them with `mice-exp records llm.records=FILE sources.use=[...]`)")
            return {n: np.array([np.nan if v is None else v for v in output.sources[n]], dtype=np.float64)
                    for n in names}
        return stage_sources(self.sources, self.stage, output, names)

    # -- the estimation
    def features(self, output: StageOutput, sources: Mapping[str, np.ndarray] | None = None) -> FeatureSet:
        """The view fitted on the training rows of ``output``, every record transformed."""
        from mice_exp.features import fit_features  # loads sklearn

        return fit_features(self.view, output, sources)

    def estimate(self, output: StageOutput) -> tuple[FeatureSet, Outcome]:
        """Confidence sources -> feature view -> protocol: the feature set and what the protocol returns, with the
        per-argument scores of the test calls when it has Table-1 rows."""
        fs = self.features(output, self.confidence_sources(output))
        outcome = self.protocol.run(self.study, fs)
        if outcome.rows:
            scores = self.argument_scores(output.records)
            outcome.add(scores.summary(), scores.metrics)
        return fs, outcome

    def argument_scores(self, records: list[Record], split: str = "test") -> ArgumentScores:
        """Per-argument and API-name confidence on one split's calls (a run's report: the test calls; a gate's
        argument rule: the training calls), labelled against their examples' gold."""
        from mice_exp.features.arguments import argument_metrics  # loads sklearn

        examples = {e.id: e for e in self.stage.selection.examples}
        return argument_metrics([r for r in records if r["split"] == split], examples, self.stage.prompt.fmt)

    def argument_rule(self, records: list[Record]) -> dict[str, Any]:
        """What a gate fitted on ``records`` asks the user about: the rule that localises a wrong argument best on
        the training calls (:func:`~mice_exp.features.arguments.localizing_rule`)."""
        from mice_exp.features.arguments import localizing_rule  # loads sklearn

        return localizing_rule(self.argument_scores(records, "train"))

    def demo_pool(self) -> list[Example]:
        """The pool the LLM stage retrieved demonstrations from (``prompt.demo_pool``): what a gate keeps."""
        return demo_pool(self.stage.selection, self.stage.prompt.demo_pool)

    # -- the tracker
    def tags(self) -> dict[str, str]:
        """The run's identifying tags, its config hash and the Hydra job's tags."""
        return {**schema.job_tags(self.config), schema.CONFIG_HASH_TAG: config_hash(self.config), **hydra_tags()}

    def tracked_run(self, tags: Mapping[str, str]) -> AbstractContextManager[Any]:
        """The run's MLflow run (or a tracker that records nothing), ended FINISHED or FAILED however it ends."""
        return tracked_run(self.tracking, self.paths.root, run_name=run_name(tags), params=self.config, tags=tags)
