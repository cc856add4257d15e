"""``mice-exp report``: the paper's tables and figures from the FINISHED runs in MLflow.

    mice-exp report                                  # experiment mice_exp, default store
    mice-exp report --sweep multirun/2025-01-01/12-00-00 --preset table1
    mice-exp report --experiment other --tracking-uri http://host:5000 --out /tmp/report

Reads MLflow only (run tags, params, metrics and ``predictions.csv`` artifacts), then

* builds Table 1 and the feature-ablation Table 2 (:mod:`mice_exp.report.tables`), as Markdown
  (``results.md``) and one CSV (``results.csv``, column ``table`` tells them apart);
* draws ETCU curves per LLM with the trivial policies and, when leave-one-API-out runs exist,
  holdout vs zero-shot AUC bars (:mod:`mice_exp.report.plots`);
* logs all of it under ``report/`` to the sweep's parent run (tags ``sweep_parent=true`` and
  the same ``sweep``) if there is one, else to a new run named ``report``; and
* with ``--preset NAME`` writes the files into ``experiments/NAME/`` (``--out DIR``: into DIR).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from mice_exp.errors import UserError
from mice_exp.paths import project_root, writable_folder
from mice_exp.report import plots, tables
from mice_exp.report.arguments import DEFAULT_EXPERIMENT, parse_args
from mice_exp.report.collect import (
    Predictions,
    RunRecord,
    collect_runs,
    experiment_ids,
    latest_per_key,
    sweep_runs,
    to_record,
)
from mice_exp.report.extras import FITS_FILE, Section, extra_sections
from mice_exp.report.intervals import RESAMPLES as INTERVAL_RESAMPLES
from mice_exp.report.intervals import add_intervals
from mice_exp.report.paper_terms import RESAMPLES as PAPER_RESAMPLES
from mice_exp.report.paper_terms import long_predictions, paper_terms, paper_terms_markdown
from mice_exp.report.selective import selective_markdown, selective_table
from mice_exp.tracking.dashboard import run_link
from mice_exp.tracking.gitinfo import git_tags
from mice_exp.tracking.schema import PARENT_TAG, REPORT_TAG, SWEEP_TAG
from mice_exp.tracking.store import open_client, tracking_uri
from mice_exp.tracking.sweeps import find_parent_run

logger = logging.getLogger(__name__)

ARTIFACT_DIR = "report"
MARKDOWN_FILE = "results.md"
CSV_FILE = "results.csv"
PREDICTIONS_FILE = "predictions.csv"  # every Table-1 and ablation row's test predictions, one line per (row, call)
REPORT_RUN_NAME = "report"
#: The names of every file a report can write (its figures are named per LLM): what ``--force`` clears from the
#: folder, so an earlier report's figure of another LLM does not stay beside the new results.
WRITES = (MARKDOWN_FILE, CSV_FILE, PREDICTIONS_FILE, "etcu_*.png", plots.LOAO_FILE, "sample_efficiency_*.png",
          FITS_FILE, "risk_sweep_*.png")


@dataclass
class Report:
    """Everything the report writes; ``files()`` renders it into a folder."""

    records: list[RunRecord]
    table1: pd.DataFrame
    ablation: pd.DataFrame
    figures: dict[str, Figure] = field(default_factory=dict)
    experiment: str | None = None
    sweep: str | None = None
    extras: list[Section] = field(default_factory=list)
    selective: pd.DataFrame = field(default_factory=pd.DataFrame)  # Table 1's rows with PRR and AURC
    #: Experiment of every run read, tables' or extras' (where the report run goes), most used first.
    experiment_ids: list[str] = field(default_factory=list)
    n_jobs: int = 0  # FINISHED job runs read (tables and extra sections)
    paper_terms: pd.DataFrame = field(default_factory=pd.DataFrame)  # gains over raw / NWKR, euro, accuracy
    predictions: pd.DataFrame = field(default_factory=pd.DataFrame)  # long: one line per (table, row, call)
    resamples: int = PAPER_RESAMPLES  # the bootstrap resamples behind paper_terms' intervals

    @property
    def csv(self) -> pd.DataFrame:
        frames = [tables.results_csv(self.table1, self.ablation), self.selective, self.paper_terms,
                  *(s.frame for s in self.extras)]
        return pd.concat([f for f in frames if not f.empty] or frames[:1], ignore_index=True)

    @property
    def markdown(self) -> str:
        source = f"experiment `{self.experiment}`" if self.experiment else "all experiments"
        if self.sweep:
            source += f", sweep `{self.sweep}`"
        parts = [
            "# mice_exp results",
            f"{len(self.records)} FINISHED runs in the tables from {source} (the latest per LLM, dataset, "
            "features, estimator and protocol)" + (f", {self.n_jobs} job runs read in all" if self.extras else "")
            + "; the `run_id` column of results.csv gives each row's run.",
            *tables.markdown_sections(self.table1, self.ablation),
        ]
        if not self.selective.empty:
            parts.append(selective_markdown(self.selective))
        if not self.paper_terms.empty:
            parts.append(paper_terms_markdown(self.paper_terms, self.table1, self.resamples))
        etcu = [name for name in self.figures if name != plots.LOAO_FILE]
        if etcu or plots.LOAO_FILE in self.figures:
            parts.append("## Figures")
        if etcu:
            parts.append("Expected tool-calling utility against the risk level τ (MICE Figure 4), with the "
                         "trivial policies dashed.\n\n" + "\n\n".join(f"![{n}]({n})" for n in etcu))
        if plots.LOAO_FILE in self.figures:
            parts.append("AUC of the ETCU curve trained on all APIs (holdout) and leaving the test API out "
                         f"(zeroshot).\n\n![{plots.LOAO_FILE}]({plots.LOAO_FILE})")
        parts += [section.markdown for section in self.extras]
        return "\n\n".join(parts) + "\n"

    def all_figures(self) -> dict[str, Figure]:
        return self.figures | {name: fig for section in self.extras for name, fig in section.figures.items()}

    def write(self, folder: Path) -> list[Path]:
        """Write results.md, results.csv and the figures into ``folder``; returns the paths."""
        folder.mkdir(parents=True, exist_ok=True)
        written = [folder / MARKDOWN_FILE, folder / CSV_FILE]
        written[0].write_text(self.markdown, encoding="utf-8")
        self.csv.to_csv(written[1], index=False)
        if not self.predictions.empty:
            written.append(folder / PREDICTIONS_FILE)
            self.predictions.to_csv(written[-1], index=False)
        for name, fig in self.all_figures().items():
            fig.savefig(folder / name, dpi=150, bbox_inches="tight")
            written.append(folder / name)
        for section in self.extras:
            for name, frame in section.files.items():
                gzip = {"method": "gzip", "mtime": 0} if name.endswith(".gz") else None  # same rows, same bytes
                frame.to_csv(folder / name, index=False, compression=gzip)
                written.append(folder / name)
        return written


def build_report(client, experiment: str | None = DEFAULT_EXPERIMENT, sweep: str | None = None,
                 features: str | None = None, with_figures: bool = True, resamples: int | None = None) -> Report:
    """Collect the runs (``experiment=None``: every experiment) and build tables and figures; ``resamples``: the
    bootstrap's, for every interval and gain (default: the published 200 and 1000)."""
    if sweep is not None:
        sweep = sweep.rstrip("/") or sweep
    ids = experiment_ids(client, experiment)
    label = f"experiment {experiment!r}" if experiment else "any experiment"
    runs = sweep_runs(client, ids, sweep)
    extras = extra_sections(client, runs)
    records = latest_per_key(r for r in map(to_record, runs) if r)
    if not records and not extras:
        collect_runs(client, ids, sweep, label)  # raises the error that names the sweeps there are
    table = tables.table1(records, features)
    ablation = tables.ablation_table(records, features)
    used = [id_ for id_, _ in Counter(run.info.experiment_id for run in runs).most_common()]
    report = Report(records, table, ablation, experiment=experiment, sweep=sweep, extras=extras, experiment_ids=used,
                    selective=selective_table(table, records),
                    n_jobs=sum(1 for run in runs if run.data.tags.get(PARENT_TAG) != "true"
                               and run.data.tags.get(REPORT_TAG) != "true"))
    if with_figures:
        with Predictions(client) as predictions:
            report.figures.update(plots.etcu_figures(table, predictions))
            tables_resamples = INTERVAL_RESAMPLES if resamples is None else resamples
            report.resamples = PAPER_RESAMPLES if resamples is None else resamples
            report.table1 = add_intervals(report.table1, predictions, tables_resamples)
            report.predictions = long_predictions(pd.concat([report.table1, report.ablation]), predictions)
            report.paper_terms = paper_terms(report.predictions, report.resamples)
            report.ablation = add_intervals(report.ablation, predictions, tables_resamples)
        panels = plots.loao_pairs(table)
        if panels:
            report.figures[plots.LOAO_FILE] = plots.loao_comparison(panels)
    return report


def target_run(client, report: Report, root: Path) -> tuple[str, bool]:
    """The run to log to: the sweep's parent run, else a new ``report`` run (created here).

    Returns (run id, created).
    """
    ids = sorted(report.experiment_ids)
    if report.sweep:
        parent = find_parent_run(client, ids, report.sweep)
        if parent is not None:
            return parent, False
    experiment_id = report.experiment_ids[0]
    tags = {"mlflow.source.name": "mice_exp report", REPORT_TAG: "true", "report.runs": str(len(report.records)),
            **git_tags(root)}
    if report.sweep:
        tags[SWEEP_TAG] = report.sweep
    run = client.create_run(experiment_id, run_name=REPORT_RUN_NAME, tags=tags)
    return run.info.run_id, True


def log_report(client, report: Report, folder: Path, root: Path) -> str:
    """Log the files of ``folder`` under ``report/`` of :func:`target_run`; returns its id."""
    run_id, created = target_run(client, report, root)
    status = "FAILED"
    try:
        client.log_artifacts(run_id, str(folder), ARTIFACT_DIR)
        status = "FINISHED"
    finally:
        if created:
            client.set_terminated(run_id, status)
    return run_id


def output_folder(args: argparse.Namespace, root: Path) -> Path | None:
    """The folder ``--preset`` / ``--out`` names, checked before any work (a report is minutes of it): writable,
    not the project, and holding no earlier report unless ``--force`` (its files would be replaced)."""
    if args.preset:
        name = Path(args.preset)
        if name.is_absolute() or ".." in name.parts or not name.parts:
            raise UserError(f"--preset {args.preset!r}; expected a folder name under experiments/")
        setting, folder = f"--preset {args.preset}", writable_folder(root / "experiments" / name, root, "--preset")
    elif args.out is not None:
        setting, folder = f"--out {args.out}", writable_folder(args.out, Path.cwd(), "--out")
    else:
        return None
    earlier = [name for name in (MARKDOWN_FILE, CSV_FILE, PREDICTIONS_FILE) if (folder / name).exists()]
    if earlier and not args.force:
        raise UserError(f"{setting}: {folder} already holds a report ({', '.join(earlier)}); expected --force to "
                        "replace it, or another folder")
    return folder


def report(argv: Sequence[str]) -> None:
    """``mice-exp report [--experiment NAME | --sweep TAG] [--tracking-uri URI] [--preset NAME | --out DIR]``."""
    args = parse_args(argv)
    root = project_root()
    out = output_folder(args, root)
    uri = tracking_uri({"uri": args.tracking_uri}, root)
    client = open_client(uri)
    experiment = args.experiment or (None if args.sweep else DEFAULT_EXPERIMENT)
    result = build_report(client, experiment, args.sweep, args.features, resamples=args.resamples)
    with tempfile.TemporaryDirectory(prefix="mice_exp_report_") as tmp:
        staged = result.write(Path(tmp))
        if not args.no_log:
            run_id = log_report(client, result, Path(tmp), root)
            link = run_link(uri, client.get_run(run_id).info.experiment_id, run_id)
            print(f"logged the report to MLflow run {run_id} (artifacts {ARTIFACT_DIR}/) in {uri}: {link}")
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            stale = sorted({p for pattern in WRITES for p in out.glob(pattern)} - {out / p.name for p in staged})
            for path in stale:
                path.unlink()
            for path in staged:
                shutil.copyfile(path, out / path.name)
            removed = f"; removed the earlier report's {', '.join(p.name for p in stale)}" if stale else ""
            print(f"wrote {', '.join(p.name for p in staged)} to {out}{removed}")
    print()
    print(printed(result))


def printed(report: Report) -> str:
    """What the command prints: every table of results.md, "On the paper's terms" included (its gains are what
    compares estimators across setups), without the figures."""
    return "\n\n".join([*tables.markdown_sections(report.table1, report.ablation),
                        *([selective_markdown(report.selective)] if not report.selective.empty else []),
                        *([paper_terms_markdown(report.paper_terms, report.table1, report.resamples)]
                          if not report.paper_terms.empty else []),
                        *(section.markdown for section in report.extras)])
