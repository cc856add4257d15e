"""Sample efficiency (MICE §6, "How sample efficient is MICE?", Figure 7).

For each training-set size s, the training rows are partitioned at random into
``floor(n_train / s)`` disjoint groups of s rows (the ``n_train % s`` left-over rows of that
partition are unused); every estimator is trained on every group and scored by AUC-ETCU on the
whole test split. Per trial the group scores give a mean and a variance; both are averaged over
``trials`` independent partitions (the paper's 100). Sizes larger than the training split are
skipped with a warning.

Randomness and determinism
    The partition of trial t at size s comes from ``np.random.default_rng([seed, s, t])``, so it
    depends on nothing else: adding a size or more trials leaves the other cells unchanged, and
    trial t of a 100-trial run is trial t of a 5-trial run. All estimators of a cell see the same
    groups (paired comparison). Estimators keep their own seeds (MICE RF's ``seed``), so one
    group always gives the same forest.

Parallelism
    One task per (size, trial, group), run by joblib in worker processes (loky). The data are
    dumped once to a memory-mapped file and every task receives a reference to it plus its
    group's row indices, never a copy of the matrix. Inside a task estimators run single-threaded
    (``n_jobs=1`` where they have it, e.g. MICE RF, and BLAS/OpenMP pools limited to one
    thread), so ``n_jobs`` processes use ``n_jobs`` cores, and a task computes exactly what the
    sequential loop (``n_jobs=1``, in-process) computes: the results are bit-identical.

Single-class groups
    Small groups can hold one label only; the estimators then warn (:class:`FallbackWarning`) and
    predict the group's base rate. Those warnings are silenced inside the grid and counted
    instead (column ``fallback_rate``).

Table columns (one row per estimator and size; see :func:`summarise`)
    ``mean``            mean over trials of the per-trial mean AUC-ETCU across groups
    ``var``             mean over trials of the per-trial variance across groups (ddof = 1;
                        NaN where a partition has a single group)
    ``std``             the error bar, the paper's "one standard deviation": the spread of the
                        AUC-ETCU of one estimator trained on ``size`` rows, ``sqrt(var)``. Where
                        a partition has one group (``var`` undefined) it is the standard deviation
                        of that single group's score across trials (ddof = 1), which estimates the
                        same quantity; ``std_source`` says which ("groups" / "trials").
    ``sd_trial_means``  standard deviation across trials of the per-trial means (ddof = 1): how
                        much the plotted mean itself moves with the partition; not the error bar.
"""

from __future__ import annotations

import hashlib
import tempfile
import types
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import joblib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from sklearn.base import clone
from threadpoolctl import ThreadpoolController
from tqdm.auto import tqdm

from mice_exp.errors import UserError
from mice_exp.estimators.base import FallbackWarning
from mice_exp.estimators.blocks import column_names, named
from mice_exp.metrics import auc_etcu
from mice_exp.needs import RAW
from mice_exp.protocols.base import Outcome, Protocol
from mice_exp.tracking.schema import SAMPLE_EFFICIENCY_CSV, SAMPLE_EFFICIENCY_FIGURE, SAMPLE_EFFICIENCY_FITS_CSV

if TYPE_CHECKING:  # annotations only
    from mice_exp.estimation import Study
    from mice_exp.features import FeatureSet

#: Training-set sizes of MICE §6 / Figure 7.
PAPER_SIZES: tuple[int, ...] = (25, 50, 75, 100, 300, 500, 750)
#: Repetitions of the random partition in MICE §6.
PAPER_TRIALS = 100

SCORE_COLUMNS = ["estimator", "size", "trial", "group", "auc_etcu", "fallback"]
TABLE_COLUMNS = ["estimator", "size", "n_groups", "trials", "mean", "var", "std", "std_source",
                 "sd_trial_means", "fallback_rate"]


def _single_threaded(estimator):
    """A fresh copy that does not start its own worker threads (tasks are already parallel)."""
    estimator = clone(estimator)
    if "n_jobs" in estimator.get_params():
        estimator.set_params(n_jobs=1)
    return estimator


def partitions(n_train: int, size: int, trial: int, seed: int) -> np.ndarray:
    """Trial ``trial``'s groups at ``size``: ``[n_groups, size]`` positions into the training rows."""
    n_groups = n_train // size
    order = np.random.default_rng([seed, size, trial]).permutation(n_train)
    return order[: n_groups * size].reshape(n_groups, size)


def _task(estimators: Mapping[str, tuple[Any, str]], data: Mapping[str, Any], rows: np.ndarray,
          _cache: dict = {}) -> list[tuple[float, bool]]:  # noqa: B006 (per-process controller cache)
    """Fit every (estimator, view) on the training rows ``rows``; AUC-ETCU on test and whether it fell back.

    Runs with BLAS/OpenMP pools at one thread, in workers and in the sequential loop alike (no
    oversubscription, and the same arithmetic in both). Only cheap globals are referenced here:
    workers receive this function by value (:func:`_by_value`).
    """
    if "threads" not in _cache:
        _cache["threads"] = ThreadpoolController()  # finding the pools costs ms; limiting them is ~free
    out = []
    with _cache["threads"].limit(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        y_train = np.asarray(data["y_train"][rows])
        for estimator, view in estimators.values():
            names = data.get(f"{view}/columns")
            fitted = clone(estimator).fit(named(np.asarray(data[f"{view}/train"][rows]), names), y_train)
            p = fitted.predict_proba(named(data[f"{view}/test"], names))[:, 1]
            out.append((auc_etcu(p, data["y_test"]), bool(fitted.fallback_)))
    return out


def _by_value(func):
    """A copy of ``func`` that cloudpickle (loky's pickler) ships by value, not by import path.

    Importing this module means importing ``mice_exp.protocols`` and through it the feature views,
    the estimation rows, Hydra and matplotlib, a second per fresh worker; shipped by value, ``_task``
    only makes workers import what it references (sklearn, mice_exp.estimators / metrics, threadpoolctl; pandas
    only for an estimator whose input is named blocks).
    The copy gets its own empty ``_cache`` (a process's thread-pool controller is not picklable).
    """
    copy = types.FunctionType(func.__code__, func.__globals__, func.__name__, ({},), func.__closure__)
    copy.__qualname__ = f"{func.__qualname__}_by_value"  # not an attribute of the module: pickled by value
    return copy


def input_slot(X: np.ndarray | pd.DataFrame) -> str:
    """Where an estimator's input (its ``design``) is kept for the tasks: a digest of its
    values and column names, so estimators share a matrix exactly when their inputs are identical (two
    calibrators of the raw confidence), never because their settings look alike (a field correction on
    raw confidence reads more columns than the calibrator of that confidence)."""
    matrix = np.asarray(X, dtype=np.float64)
    digest = hashlib.blake2b(repr((matrix.shape, matrix.dtype.str, column_names(X))).encode(), digest_size=16)
    digest.update(memoryview(np.ascontiguousarray(matrix)).cast("B"))
    return f"inputs-{digest.hexdigest()}"


def _grid(sizes: Iterable[int], n_train: int) -> list[int]:
    """Valid sizes in increasing order; oversize ones are dropped with a warning."""
    sizes = sorted({int(s) for s in sizes})
    if not sizes or sizes[0] < 1:
        raise UserError(f"sample_efficiency sizes={sizes}; expected positive integers")
    too_big = [s for s in sizes if s > n_train]
    if too_big:
        warnings.warn(f"sample_efficiency: skipping sizes {too_big}, larger than the {n_train} training rows",
                      UserWarning, stacklevel=3)
    check_sizes(sizes, n_train)
    return [s for s in sizes if s <= n_train]


def check_sizes(sizes: Iterable[int], n_train: int) -> None:
    """At least one size fits the training rows: with none left an empty table would pass for a result."""
    sizes = sorted({int(s) for s in sizes})
    if sizes and sizes[0] > n_train:
        raise UserError(f"protocol.sizes={sizes}: every size is larger than the {n_train} training rows; "
                        f"expected sizes up to {n_train}")


def sample_efficiency_scores(
    estimators: Mapping[str, Any],
    fs: FeatureSet,
    sizes: Sequence[int] = PAPER_SIZES,
    trials: int = PAPER_TRIALS,
    seed: int = 0,
    n_jobs: int | None = -1,
    sources: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One row per (estimator, size, trial, group): the test AUC-ETCU and whether the fit fell back
    (:func:`summarise` makes the table of MICE Figure 7 from them).

    ``estimators`` maps a key (e.g. "mice_rf") to an unfitted mice_exp estimator; each is cloned, never
    modified. ``n_jobs``: joblib worker processes (-1 = all cores); 1 (or None) runs the plain sequential
    loop in this process. Either way the scores are identical. ``sources`` maps an estimator key
    to the confidence source its calibrator reads (as ``estimator.source`` does for holdout;
    default the raw one); every estimator reads what it declares (its ``design``: a
    calibrator its confidence, MICE the feature view, a hidden-state probe or a field correction
    their arrays).
    """
    if not estimators:
        raise UserError("sample_efficiency needs at least one estimator")
    if trials < 1:
        raise UserError(f"sample_efficiency trials={trials}; expected at least 1")
    train, test = np.flatnonzero(fs.rows("train")), np.flatnonzero(fs.rows("test"))
    if test.size == 0:
        raise UserError("sample_efficiency: the test split is empty")
    sizes = _grid(sizes, train.size)
    sources = dict(sources or {})
    local = {}  # key -> (single-threaded copy, the slot of the matrix it reads)
    data = {"y_train": fs.labels[train], "y_test": fs.labels[test]}
    for key, estimator in estimators.items():
        copy = _single_threaded(estimator)
        X = copy.design(fs, sources.get(key, RAW))
        slot = input_slot(X)
        if f"{slot}/train" not in data:
            matrix = np.asarray(X, dtype=np.float64)
            data[f"{slot}/train"], data[f"{slot}/test"] = matrix[train], matrix[test]
            if column_names(X) is not None:  # the layout the estimator learns from X's column names
                data[f"{slot}/columns"] = column_names(X)
        local[key] = (copy, slot)
    keys = [(s, t, g) for s in sizes for t in range(trials) for g in range(train.size // s)]
    groups = {(s, t): partitions(train.size, s, t, seed) for s in sizes for t in range(trials)}

    results = list(tqdm(_fits(local, data, keys, groups, n_jobs), total=len(keys), unit="fit", mininterval=5,
                        desc="sample efficiency (size, trial, group)"))
    rows = [(name, s, t, g, auc, fell)
            for (s, t, g), result in zip(keys, results)
            for name, (auc, fell) in zip(local, result)]
    scores = pd.DataFrame(rows, columns=SCORE_COLUMNS)
    order = {name: i for i, name in enumerate(local)}
    return scores.sort_values(["estimator", "size", "trial", "group"], key=lambda c: c.map(order)
                              if c.name == "estimator" else c, kind="stable").reset_index(drop=True)


def _fits(local: Mapping[str, Any], data: dict[str, Any], keys: list[tuple[int, int, int]],
          groups: Mapping[tuple[int, int], np.ndarray], n_jobs: int | None) -> Iterator[Any]:
    """Every (size, trial, group) fit's result in ``keys`` order, as it finishes: a plain loop, or loky
    workers reading arrays shared through files that live as long as the iteration."""
    if n_jobs in (None, 1) or joblib.effective_n_jobs(n_jobs) == 1:
        for s, t, g in keys:
            yield _task(local, data, groups[s, t][g])
        return
    with tempfile.TemporaryDirectory(prefix="mice_sample_efficiency_") as folder:
        shared = {}
        for i, (name, array) in enumerate(data.items()):  # dumped once; tasks pickle a file reference
            path = Path(folder) / f"{i}.joblib"
            joblib.dump(array, path)
            shared[name] = joblib.load(path, mmap_mode="r")
        task = joblib.delayed(_by_value(_task))  # one copy: pickled once per batch of tasks
        yield from joblib.Parallel(n_jobs=n_jobs, backend="loky", return_as="generator")(
            task(local, shared, groups[s, t][g]) for s, t, g in keys)


def summarise(scores: pd.DataFrame) -> pd.DataFrame:
    """The table of MICE Figure 7 from :func:`sample_efficiency_scores` (columns: module docstring)."""
    per_trial = (scores.groupby(["estimator", "size", "trial"], sort=False)["auc_etcu"]
                 .agg(mean="mean", var=lambda a: a.var(ddof=1), n_groups="size").reset_index())
    out = []
    for (name, size), cell in per_trial.groupby(["estimator", "size"], sort=False):
        n_groups = int(cell["n_groups"].iloc[0])
        var = float(cell["var"].mean()) if n_groups > 1 else float("nan")
        spread = cell["mean"].std(ddof=1) if len(cell) > 1 else float("nan")
        fell = scores.loc[(scores["estimator"] == name) & (scores["size"] == size), "fallback"].mean()
        out.append({"estimator": name, "size": int(size), "n_groups": n_groups, "trials": len(cell),
                    "mean": float(cell["mean"].mean()), "var": var,
                    "std": float(np.sqrt(var)) if n_groups > 1 else float(spread),
                    "std_source": "groups" if n_groups > 1 else "trials",
                    "sd_trial_means": float(spread), "fallback_rate": float(fell)})
    return pd.DataFrame(out, columns=TABLE_COLUMNS)


def sample_efficiency_figure(
    table: pd.DataFrame,
    labels: Mapping[str, str] | None = None,
    title: str = "",
) -> Figure:
    """MICE Figure 7: mean AUC-ETCU ± one standard deviation (``std``) against training size, log x.

    ``labels`` maps estimator keys to legend names (default: the keys). Built on the Agg canvas
    without pyplot, like :mod:`mice_exp.report.figures`.
    """
    labels = dict(labels or {})
    fig = Figure(figsize=(6.0, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, cell in table.groupby("estimator", sort=False):
        cell = cell.sort_values("size")
        ax.errorbar(cell["size"], cell["mean"], yerr=cell["std"], marker="o", markersize=4,
                    capsize=3, label=labels.get(name, name))
    ax.set_xscale("log")
    sizes = sorted(table["size"].unique())
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("training set size")
    ax.set_ylabel("AUC-ETCU")
    ax.set_title(title or "Sample efficiency (error bars: one standard deviation)")
    ax.grid(alpha=0.3)
    if len(table):
        ax.legend()
    fig.tight_layout()
    return fig


class SampleEfficiency(Protocol):
    """MICE Figure 7 as a protocol (``conf/protocol/sample_efficiency.yaml``): ``estimators`` are keys of
    the composed ``baselines`` (so ``baselines.mice_rf.model.n_estimators=100`` reaches them too),
    each trained on disjoint random groups of every size in ``sizes``, ``trials`` times; ``n_jobs``
    worker processes (any value gives the same table)."""

    name = "sample_efficiency"

    def __init__(self, sizes: Sequence[int] = PAPER_SIZES, trials: int = PAPER_TRIALS, n_jobs: int | None = -1,
                 estimators: Sequence[str] = ("hre", "nwkr", "mice_lr", "mice_rf")):
        self.sizes = sizes
        self.trials = trials
        self.n_jobs = n_jobs
        self.estimators = estimators

    def check_training_calls(self, n_train: int) -> None:
        check_sizes(self.sizes, n_train)

    def run(self, study: Study, fs: FeatureSet) -> Outcome:
        """The table (logged as ``sample_efficiency.csv``), every fit behind it (``sample_efficiency_fits.csv``,
        so a mean or a crossing can be re-checked without refitting) and the figure; no Table-1 rows."""
        candidates = [study.candidate(key, "protocol.estimators") for key in self.estimators]
        fits = sample_efficiency_scores({c.key: c.estimator for c in candidates}, fs, sizes=self.sizes,
                                        trials=int(self.trials), seed=study.seed, n_jobs=self.n_jobs,
                                        sources={c.key: c.source for c in candidates})
        table = summarise(fits)
        figure = sample_efficiency_figure(table, labels={c.key: c.name for c in candidates}, title=study.llm)
        return Outcome(text=table.to_string(), tables={SAMPLE_EFFICIENCY_CSV: table, SAMPLE_EFFICIENCY_FITS_CSV: fits},
                       figures={SAMPLE_EFFICIENCY_FIGURE: figure})
