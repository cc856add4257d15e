"""Every published permutation p recomputed from the published predictions with the decided test, and every mark
that it changes.

    python benchmarks/marks_recheck.py [--csv benchmarks/marks_recheck.csv] [--republish] > benchmarks/marks_recheck.txt

Reads every ``experiments/**/results.csv`` with p-value columns (``<metric>_p_<ref>``: a run's test of its estimator
against the HRE / NWKR rows it trained, on every Table 1 metric) beside its ``predictions.csv``, and
``experiments/cross_model/gains.csv`` (``compare.py``'s p of each row against the actor's raw confidence, NWKR and
MICE RF). A run's reference rows are the ones its block displays: every run of a block trains HRE and NWKR on the
same calls. That these are the inputs each run tested is checked, not assumed: every published p is first
recomputed with the test it was published with (``mice_exp/metrics/permutation.py`` at :data:`PUBLISHED`, read from
git), which must give it back exactly. Then the decided test (:func:`mice_exp.metrics.permutation_test`, seed 0 as
the runs used) gives its p, and the mark follows the report's rule (:func:`mice_exp.report.tables.significance_marks`;
for gains, p < alpha). Prints the CPU, a count per file, every test whose mark changes and every p between 0.03
and 0.07; ``--csv`` writes every test, ``--republish`` the new p-values and marks of every results.csv (and the
Table 1 of its results.md) where a mark changes.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import math
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from mice_exp.metrics import ALPHA, PAPER_RISKS, permutation_test
from mice_exp.metrics.registry import metric
from mice_exp.paths import PACKAGE_ROOT
from mice_exp.report.tables import METRICS, significance_marks, to_markdown
from mice_exp.tracking.schema import MARKS, baseline_key, pvalue_key

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cputime import cpu_line  # noqa: E402  (benchmarks/, the script's own folder)

#: The last commit of the test every published p was made with (1000 draws; a run's stopped once p >= alpha held).
PUBLISHED = "fbf4a4f"
EXPERIMENTS = PACKAGE_ROOT / "experiments"


def published_test() -> Callable[..., object]:
    """``permutation_test`` as it was at :data:`PUBLISHED`, from git, run against today's ``check_pair``."""
    source = subprocess.run(["git", "show", f"{PUBLISHED}:mice_exp/metrics/permutation.py"], cwd=PACKAGE_ROOT,
                            capture_output=True, text=True, check=True).stdout
    module = sys.modules["published_permutation"] = types.ModuleType("published_permutation")  # for its dataclass
    exec(compile(source, f"{PUBLISHED}:mice_exp/metrics/permutation.py", "exec"), module.__dict__)
    return module.permutation_test


def as_published(path: Path) -> pd.DataFrame:
    """A results file as :data:`PUBLISHED` holds it (the working tree's may be republished already)."""
    text = subprocess.run(["git", "show", f"{PUBLISHED}:{path.relative_to(PACKAGE_ROOT)}"], cwd=PACKAGE_ROOT,
                          capture_output=True, text=True, check=True).stdout
    return pd.read_csv(io.StringIO(text), low_memory=False)


def run_tests(folder: Path, old: Callable[..., object]) -> Iterator[dict]:
    """One dict per published p of ``folder``'s results.csv: the run's row against a displayed reference row."""
    results = as_published(folder / "results.csv")
    predictions = pd.read_csv(folder / "predictions.csv").drop_duplicates(["run_id", "estimator", "protocol", "id"])
    columns = [f"{m}_p_{ref}" for m in METRICS for ref in MARKS]
    runs = results[results[columns].notna().any(axis=1)].drop_duplicates(["run_id", "estimator", "protocol"])
    shown = results[results["source"] == "baseline"].drop_duplicates(["dataset", "llm", "estimator"])
    for run in runs.itertuples():
        mine = _series(predictions, run.run_id, run.estimator, run.protocol)
        refs = {}
        for ref in MARKS:
            source = shown[(shown["dataset"] == run.dataset) & (shown["llm"] == run.llm) & (shown["estimator"] == ref)]
            refs[ref] = _series(predictions, source["run_id"].iloc[0], ref, "holdout").loc[mine.index]
        y = mine["label"].to_numpy(int)
        p = mine["confidence"].to_numpy(float)
        for m in METRICS:
            fn, rows = metric(m).oriented(PAPER_RISKS)
            value = metric(m).at(PAPER_RISKS)
            tests, metrics = {}, {m: value(p, y)}
            for ref, frame in refs.items():
                q = frame["confidence"].to_numpy(float)
                published = getattr(run, f"{m}_p_{ref}")
                if not np.isfinite(published):
                    continue
                # the ETCU rows forms are newer than the published test; the check below says they count the same
                again = old(fn, p, q, y, n_permutations=1000, seed=0, alpha=ALPHA, rows_metric=rows).p_value
                new = permutation_test(fn, p, q, y, seed=0, alpha=ALPHA, rows_metric=rows)
                tests[ref] = (published, again, new)
                metrics[baseline_key(ref, m)] = value(q, y)
            before = significance_marks(metrics | {pvalue_key(m, r): t[0] for r, t in tests.items()}, m)
            after = significance_marks(metrics | {pvalue_key(m, r): t[2].p_value for r, t in tests.items()}, m)
            for ref, (published, again, new) in tests.items():
                yield {"file": str((folder / "results.csv").relative_to(PACKAGE_ROOT)), "llm": run.llm,
                       "row": run.row, "table": run.table, "run_id": run.run_id, "estimator": run.estimator,
                       "protocol": run.protocol, "test": f"{m} vs {ref}",
                       "published_p": published, "published_again": again == published, "new_p": new.p_value,
                       "draws": new.draws, "exact": new.exact, "decided": new.decided,
                       "mark": MARKS[ref] in before, "new_mark": MARKS[ref] in after,
                       "printed_mark": MARKS[ref] in str(getattr(run, f"{m}_mark")) if run.table == "table1"
                       else None,
                       "value_matches": bool(np.isclose(metrics[m], getattr(run, m), rtol=0, atol=1e-12))}


def _blank(frame: pd.DataFrame) -> pd.DataFrame:
    """Table rows as the report renders them: no mark or style is "" (an empty CSV cell reads back as NaN)."""
    columns = [f"{m}_{kind}" for m in METRICS for kind in ("mark", "style")]
    return frame.astype({c: object for c in columns}).fillna({c: "" for c in columns})


def _series(predictions: pd.DataFrame, run_id: str, estimator: str, protocol: str) -> pd.DataFrame:
    """One row's test predictions by call id, in the run's order (a test's swap draws follow the calls' order)."""
    rows = predictions[(predictions["run_id"] == run_id) & (predictions["estimator"] == estimator)
                       & (predictions["protocol"] == protocol)]
    return rows.set_index("id")[["confidence", "label"]]


def gains_tests(old: Callable[..., object]) -> Iterator[dict]:
    """One dict per p of experiments/cross_model/gains.csv, recomputed from compare.py's own tests."""
    compare = _script(EXPERIMENTS / "cross_model" / "compare.py")
    folder = EXPERIMENTS / "cross_model"
    own = pd.read_csv(EXPERIMENTS / "table1" / "predictions.csv")
    cross, gates = pd.read_csv(folder / "predictions.csv"), pd.read_csv(folder / "self_gate_predictions.csv")
    gains = as_published(folder / "gains.csv").set_index(["llm", "judge", "estimator"])
    for actor, judge in compare.PAIRS:
        block = compare.rows_of(actor, judge, own, cross, compare.published_gate(gates, actor, judge))
        for estimator, column, fn, rows, p, q, y in compare.tests(block):
            published = gains.loc[(actor, judge, estimator), column]
            again = old(fn, p, q, y, n_permutations=1000, seed=0, rows_metric=rows)
            new = permutation_test(fn, p, q, y, seed=0, alpha=ALPHA, rows_metric=rows)
            yield {"file": "experiments/cross_model/gains.csv", "llm": actor, "row": estimator, "table": "gains",
                   "run_id": f"judge {judge}", "test": column[2:].replace("_vs_", " vs "), "published_p": published,
                   "published_again": again.p_value == published, "new_p": new.p_value, "draws": new.draws,
                   "exact": new.exact, "decided": new.decided, "mark": published < ALPHA,
                   "new_mark": new.p_value < ALPHA, "printed_mark": None, "value_matches": True}


def _script(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--csv", help="write every test here")
    parser.add_argument("--republish", action="store_true",
                        help="write the new p-values and marks into each results.csv (and results.md) where one moves")
    args = parser.parse_args()
    old = published_test()
    folders = sorted(path.parent for path in EXPERIMENTS.rglob("results.csv")
                     if (path.parent / "predictions.csv").exists())
    tests = pd.DataFrame([*(t for folder in folders for t in run_tests(folder, old)), *gains_tests(old)])
    if args.csv:
        tests.to_csv(args.csv, index=False)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PACKAGE_ROOT, capture_output=True,
                          text=True).stdout.strip()
    print(f"benchmarks/marks_recheck.py at {head}; {cpu_line()}")
    print(f"published p: permutation.py at {PUBLISHED} (1000 draws, seed 0; a run's stopped once p >= {ALPHA} held); "
          f"new p: the decided test (seed 0, 99.9% Clopper-Pearson interval off {ALPHA}, at most 2^20 draws)\n")
    tests["as_printed"] = tests["printed_mark"].isna() | (tests["printed_mark"] == tests["mark"])
    print("| file | tests | published p given back | metric values given back | marks as printed | marks | "
          "marks changed | new p exact | undecided | draws: median, max |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for file, group in tests.groupby("file", sort=False):
        print(f"| {file} | {len(group)} | {group['published_again'].sum()} | {group['value_matches'].sum()} | "
              f"{group['as_printed'].sum()} | {group['mark'].sum()} | {(group['mark'] != group['new_mark']).sum()} | "
              f"{group['exact'].sum()} | {(~group['decided']).sum()} | {int(group['draws'].median())}, "
              f"{group['draws'].max()} |")
    shown = ["file", "llm", "row", "test", "published_p", "new_p", "draws", "mark", "new_mark"]
    for title, picked in (("Marks that change", tests["mark"] != tests["new_mark"]),
                          ("Every p between 0.03 and 0.07", tests["new_p"].between(0.03, 0.07)
                           | tests["published_p"].between(0.03, 0.07)),
                          ("Published p, metric value or mark not given back",
                           ~(tests["published_again"] & tests["value_matches"] & tests["as_printed"]))):
        print(f"\n{title}: {picked.sum()}")
        if picked.any():
            print(_markdown(tests.loc[picked, shown]))
    if args.republish:
        for path in republish(tests):
            print(f"republished {path.relative_to(PACKAGE_ROOT)}")


def _markdown(frame: pd.DataFrame) -> str:
    cells = [[f"{v:.4f}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    return "\n".join(["| " + " | ".join(frame.columns) + " |", "|---" * len(frame.columns) + "|",
                      *("| " + " | ".join(row) + " |" for row in cells)])


def republish(tests: pd.DataFrame) -> list[Path]:
    """Each results.csv where a mark changes gets the decided test's p-values and marks, and its results.md the
    Table 1 they give (found as the report rendered it from the published columns, or refused)."""
    written = []
    runs = tests[tests["table"] != "gains"]
    for file in runs.loc[runs["mark"] != runs["new_mark"], "file"].unique():
        path = PACKAGE_ROOT / file
        before = as_published(path)
        after = before.astype({f"{m}_mark": object for m in METRICS})
        for (run_id, estimator, protocol), group in runs[runs["file"] == file].groupby(
                ["run_id", "estimator", "protocol"]):
            rows = (after["run_id"] == run_id) & (after["estimator"] == estimator) & (after["protocol"] == protocol)
            for t in group.itertuples():
                column = "_p_".join(t.test.split(" vs "))
                after.loc[rows & after[column].notna(), column] = t.new_p
            for name in METRICS:
                marked = group[(group["test"].str.startswith(f"{name} vs ")) & group["new_mark"]]
                mark = "".join(MARKS[ref] for ref in MARKS if f"{name} vs {ref}" in set(marked["test"]))
                after.loc[rows & (after["table"] == "table1"), f"{name}_mark"] = mark or math.nan
        markdown = path.with_name("results.md")
        text = markdown.read_text()
        for dataset in before.loc[before["table"] == "table1", "dataset"].unique():
            old, new = (to_markdown(_blank(frame[(frame["table"] == "table1") & (frame["dataset"] == dataset)]),
                                    "Confidence Estimator") for frame in (before, after))
            if old not in text and new not in text:  # neither published nor republished
                raise SystemExit(f"{markdown}: its Table 1 on {dataset} is not the one results.csv renders")
            text = text.replace(old, new)
        after.to_csv(path, index=False)
        markdown.write_text(text)
        written += [path, markdown]
    return written


if __name__ == "__main__":
    main()
