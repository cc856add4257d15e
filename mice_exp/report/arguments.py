"""The arguments of ``mice-exp report``, apart from the report itself so ``--help`` answers in a blink
(building the report imports scikit-learn, pandas and matplotlib: seconds)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from mice_exp.errors import UserError

DEFAULT_EXPERIMENT = "mice_exp"
#: The features of the paper's main table (the default config's) when more than one was run.
DEFAULT_FEATURES = "bertscore"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mice-exp report",
        description="Tables (MICE Table 1, feature ablation) and figures from the FINISHED runs in MLflow.",
    )
    parser.add_argument("--experiment", default=None,
                        help=f"MLflow experiment to read (default {DEFAULT_EXPERIMENT}; with --sweep and no "
                             "--experiment, every experiment is searched)")
    parser.add_argument("--sweep", default=None,
                        help="only runs tagged sweep=SWEEP (a multirun folder such as multirun/2025-01-01/12-00-00)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI (default: the project's sqlite:///<root>/mlruns/mlflow.db)")
    parser.add_argument("--features", default=None,
                        help=f"feature set of Table 1 (default {DEFAULT_FEATURES} when present, else the "
                             "one with most runs)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--preset", default=None, help="also write the files into experiments/PRESET/")
    where.add_argument("--out", default=None, help="also write the files into DIR")
    parser.add_argument("--force", action="store_true",
                        help="replace the report an earlier one wrote in the --preset / --out folder")
    parser.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")
    parser.add_argument("--resamples", type=int, default=None,
                        help="bootstrap resamples of every interval and gain (default: 200 for the tables' "
                             "intervals and 1000 for the gains on the paper's terms, as published; fewer for a "
                             "quick look)")
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise UserError("invalid arguments for `mice-exp report` (see `mice-exp report --help`)") from None
        raise
    if args.resamples is not None and args.resamples < 2:
        raise UserError(f"--resamples {args.resamples}; expected at least 2 bootstrap resamples")
    return args
