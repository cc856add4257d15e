"""The saved form of a gate: one folder, no pickle anywhere.

Layout of a gate folder::

  gate.json          what the gate is: LLM, prompt, retrieval and feature configs, risk and tau,
                     feature columns, estimator class and params, the per-argument rule (``arguments``),
                     checksums of the other files
  estimator.skops    the fitted estimator (skops.io; loaded with an explicit list of trusted types)
  view.skops         the run's fitted feature view (a PCA view's projections), which transforms new queries
                     (absent from gates saved before the gate kept it: their views are stateless)
  demo_pool.jsonl    the examples demonstrations are retrieved from, one Example per line
  templates/         the prompt's instruction and system templates, as the pipeline used them

Everything is JSON, text or skops. :func:`load_skops` asks skops which types a file would build
and refuses any that is not in :func:`trusted_types` before loading anything.
"""

from __future__ import annotations

import datetime as _dt
import json
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mice_exp import __version__
from mice_exp.cache import file_sha256, read_jsonl, write_json, write_jsonl
from mice_exp.data.records import Example
from mice_exp.discover import class_path, type_path
from mice_exp.errors import UserError
from mice_exp.jsonable import jsonable
from mice_exp.llm.prompt import load_template, template_problem
from mice_exp.needs import RAW
from mice_exp.tracking.schema import PRODUCT

if TYPE_CHECKING:  # annotations only
    from mice_exp.metrics import Risk
    from mice_exp.pipeline import Pipeline

GATE_FORMAT = 1
SPEC_FILE = "gate.json"
ESTIMATOR_FILE = "estimator.skops"
VIEW_FILE = "view.skops"
POOL_FILE = "demo_pool.jsonl"
TEMPLATE_DIR = "templates"
SPEC_KEYS = ("llm", "llm_stage", "prompt", "templates", "retrieval", "features", "columns", "risk", "seed",
             "estimator", "demo_pool")
#: The entries of ``gate.json`` that name a file with its checksum (``view``: absent from older gates).
FILE_ENTRIES = ("estimator", "view", "demo_pool")

# Keys that decide what the LLM generates (device and batch size do not enter the gate's identity).
LLM_IDENTITY = ("name", "source", "dtype", "max_new_tokens", "context_window")
ENGINE_SETTINGS = ("backend",)  # llm settings a gate may run under other than its saved ones (what runs the LLM)
FEATURE_IDENTITY = ("view", "layers", "confidence", "components", "sources")
ENCODER_IDENTITY = ("model", "num_layers")


def trusted_types() -> frozenset[str]:
    """Every type a gate's skops files may build beyond skops' own defaults (numpy, scipy, scikit-learn, a
    PCA included): the estimator classes (:func:`mice_exp.estimators.estimator_classes`), the types each declares
    its fitted state holds (``holds``) and the feature view classes (:func:`mice_exp.features.view_classes`)."""
    from mice_exp.estimators import estimator_classes  # loads sklearn, scipy
    from mice_exp.features import view_classes  # loads sklearn

    estimators = estimator_classes()
    return frozenset(map(type_path, [*estimators, *view_classes()])).union(*(cls.holds for cls in estimators))


def risk_entry(risk_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The configured risk (a ``conf/risk`` node) with its threshold tau (execute iff p > tau)."""
    from mice_exp.estimation import risks_from  # loads sklearn, joblib

    return risk_spec(str(risk_cfg["name"]), risks_from(risk_cfg)[risk_cfg["name"]])


def risk_spec(name: str, risk: Risk) -> dict[str, Any]:
    """``gate.json``'s ``risk``: a risk's name, its utilities and the threshold it implies (:attr:`Risk.tau`)."""
    return {"name": name, "tp": risk.tp, "fp": risk.fp, "tn": risk.tn, "fn": risk.fn, "tau": risk.tau}


def check_estimator(estimator: Any, columns: Sequence[str]) -> None:
    """A fitted estimator of an allowed class whose input width matches the feature columns."""
    from sklearn.utils.validation import check_is_fitted

    from mice_exp.estimators import estimator_classes  # loads sklearn, scipy

    if class_path(estimator) not in map(type_path, estimator_classes()):
        raise UserError(f"a gate holds one of the mice_exp estimators; got {class_path(estimator)}")
    check_is_fitted(estimator)
    names = estimator.input_columns(columns)  # None: X names blocks of its own, which a gate refuses before
    width = len(columns if names is None else names)
    if getattr(estimator, "n_features_in_", width) != width:
        raise UserError(f"{type(estimator).__name__} was fitted on {estimator.n_features_in_} columns; "
                        f"the feature view has {width} ({', '.join(columns[:5])}{', ...' if len(columns) > 5 else ''})")


def dump(obj: Any) -> bytes:
    """``obj`` as a skops file, refused (one line) when it holds a type a gate would not load."""
    import skops.io as sio

    data = sio.dumps(obj, compression=zipfile.ZIP_DEFLATED)  # a forest's node arrays compress ~3x
    untrusted = set(sio.get_untrusted_types(data=data)) - trusted_types()
    if untrusted:
        raise UserError(f"{type(obj).__name__} holds types the gate would refuse to load: {sorted(untrusted)}")
    return data


def save_gate(
    folder: str | Path,
    pipeline: Pipeline,
    estimator: Any,
    view: Any,
    demo_pool: Sequence[Example],
    llm_stage: Mapping[str, Any] | None = None,
    provenance: Mapping[str, Any] | None = None,
    arguments: Mapping[str, Any] | None = None,
) -> Path:
    """Write a gate folder for a fitted ``estimator`` and return it.

    Args:
        folder: where to write (created; an existing gate there is replaced).
        pipeline: the run's objects (:class:`~mice_exp.pipeline.Pipeline`): its LLM stage's ``llm``, ``prompt``,
            ``retrieval`` (and ``dataset``, kept as provenance), its ``feature_settings`` (the ``features``
            node), its study's risk, seed and estimator's key and name.
        estimator: the fitted estimator (holdout protocol: trained on the training split).
        view: the fitted feature view (``FeatureSet.view``) whose columns the estimator was fitted on; the
            gate transforms new queries with it.
        demo_pool: the examples demonstrations are retrieved from (the pipeline uses the run's examples).
        llm_stage: the LLM stage's ``done.json`` summary (``n_layers``, ``hidden_size`` are checked
            against the loaded model).
        provenance: anything else worth keeping (run id, metrics).
        arguments: which per-argument confidence the gate reports and asks the user about
            (:meth:`~mice_exp.pipeline.Pipeline.argument_rule` of the training calls; None: ``product``).
    """
    stage, study = pipeline.stage, pipeline.study
    reason = pipeline.gate_unsupported()
    if reason:
        raise UserError(f"cannot save this pipeline as a gate: {reason}")
    columns = list(view.get_feature_names_out())
    check_estimator(estimator, columns)
    k = int(stage.prompt.k_demos)
    if len(demo_pool) < k:
        raise UserError(f"the demo pool has {len(demo_pool)} examples; prompt.k_demos={k} needs at least that many")
    files = {ESTIMATOR_FILE: dump(estimator), VIEW_FILE: dump(view)}

    folder = Path(folder)
    (folder / TEMPLATE_DIR).mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    write_jsonl(folder / POOL_FILE, [e.row() for e in demo_pool])
    templates = {}
    for role in ("template", "system"):
        name = f"{role}.txt"
        (folder / TEMPLATE_DIR / name).write_text(load_template(getattr(stage.prompt, role)), encoding="utf-8")
        templates[role] = f"{TEMPLATE_DIR}/{name}"
    sums = {role: file_sha256(folder / rel) for role, rel in templates.items()}
    spec = {
        "format": GATE_FORMAT,
        "mice_exp_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "llm": stage.llm.as_dict(),
        "llm_stage": dict(llm_stage or {}),
        "prompt": stage.prompt.as_dict(),
        "templates": templates,
        "templates_sha256": sums,
        "retrieval": stage.retrieval.as_dict(),
        "features": dict(pipeline.feature_settings),
        "columns": columns,
        "view": {"class": class_path(view), "file": VIEW_FILE, "sha256": file_sha256(folder / VIEW_FILE)},
        "risk": risk_spec(study.risk, study.risks[study.risk]),
        "seed": study.seed,
        "estimator": {
            "key": study.main.key, "name": study.main.name,
            "class": class_path(estimator), "params": jsonable(estimator.get_params()), "source": RAW,
            "input_kind": estimator.reads.name, "file": ESTIMATOR_FILE, "sha256": file_sha256(folder / ESTIMATOR_FILE),
        },
        "arguments": dict(arguments or {"rule": PRODUCT}),
        "demo_pool": {"file": POOL_FILE, "size": len(demo_pool), "sha256": file_sha256(folder / POOL_FILE)},
        "dataset": dict(stage.dataset.settings),
        "provenance": dict(provenance or {}),
    }
    write_json(folder / SPEC_FILE, spec)
    return folder


def check_templates(folder: Path, spec: Mapping[str, Any], tools: str) -> None:
    """The gate's saved templates are the ones it was saved with (their sha256, in gates saved since it was kept)
    and fill under ``prompt.tools=tools``: an edited template would otherwise answer with a prompt the estimator
    never saw, or fail at the first request."""
    for role, rel in spec["templates"].items():
        path = folder / rel
        wanted = (spec.get("templates_sha256") or {}).get(role)
        if wanted is not None and file_sha256(path) != wanted:
            raise UserError(f"{path} is not the {role} template this gate was saved with (its sha256 differs from "
                            f"{SPEC_FILE}'s); expected the folder exactly as save_gate wrote it")
        problem = template_problem(path.read_text(encoding="utf-8"), tools)
        if role == "template" and problem:
            raise UserError(f"{path}: {problem}; expected the gate's template as saved")


def read_spec(folder: Path) -> dict[str, Any]:
    """``gate.json`` with its format and file checksums verified."""
    path = folder / SPEC_FILE
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        raise UserError(f"{folder} is not a gate folder: no {SPEC_FILE} (expected a folder written by save_gate)") from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not valid JSON ({error.msg})") from None
    if not isinstance(spec, dict) or spec.get("format") != GATE_FORMAT:
        raise UserError(f"{path}: gate format {spec.get('format') if isinstance(spec, dict) else None!r}; "
                        f"this mice_exp reads format {GATE_FORMAT}")
    missing = [k for k in SPEC_KEYS if k not in spec]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}; expected the file save_gate writes")
    for entry in (spec[key] for key in FILE_ENTRIES if key in spec):
        file = folder / entry["file"]
        if not file.is_file():
            raise UserError(f"{folder}: {entry['file']} is missing")
        if file_sha256(file) != entry["sha256"]:
            raise UserError(f"{file} does not match the checksum in {SPEC_FILE}: the files come from different "
                            "gates or were changed; expected the folder exactly as save_gate wrote it")
    return spec


def load_estimator(path: Path, expected_class: str) -> Any:
    """The fitted estimator in a skops file (:func:`load_skops`)."""
    from mice_exp.estimators import estimator_classes  # loads sklearn, scipy

    return load_skops(path, expected_class, estimator_classes(), "estimator")


def load_view(path: Path, expected_class: str) -> Any:
    """The run's fitted feature view in a skops file (:func:`load_skops`)."""
    from mice_exp.features import view_classes  # loads sklearn

    return load_skops(path, expected_class, view_classes(), "view")


def load_skops(path: Path, expected_class: str, classes: Sequence[type], what: str) -> Any:
    """The object of ``expected_class`` (a class path) in a skops file, refusing any type outside
    :func:`trusted_types` and any class outside ``classes`` (what a gate's ``what`` may be).

    skops reconstructs objects from a JSON schema and .npy arrays (read with allow_pickle=False);
    it imports and instantiates only the types passed as ``trusted`` (plus its own defaults), so
    loading runs no pickled code.
    """
    import skops.io as sio

    if expected_class not in map(type_path, classes):
        raise UserError(f"{path.parent / SPEC_FILE} names {what} class {expected_class!r}; "
                        f"a gate holds one of {', '.join(cls.__name__ for cls in classes)}")
    data = path.read_bytes()
    try:
        found = sio.get_untrusted_types(data=data)
    except Exception as error:  # noqa: BLE001 - a damaged file: say which one
        raise UserError(f"{path} is not a readable skops file ({type(error).__name__}: {error})") from None
    refused = sorted(set(found) - trusted_types())
    if refused:
        raise UserError(f"{path} contains types a gate does not trust: {', '.join(refused)}; refusing to load it")
    try:
        loaded = sio.loads(data, trusted=sorted(found))
    except ValueError as error:  # e.g. an object array, which a gate never holds and numpy will not unpickle
        raise UserError(f"{path} is not a gate's skops file ({str(error)[:80]}); refusing to load it") from None
    if class_path(loaded) != expected_class:
        raise UserError(f"{path} holds a {class_path(loaded)}; {SPEC_FILE} says {expected_class}")
    return loaded


def load_pool(path: Path) -> list[Example]:
    return [Example.from_row(row) for row in read_jsonl(path)]
