"""`mice-exp report` against a real SQLite MLflow store filled by writing runs with MlflowClient.

The fake runs carry the numbers of MICE Table 1 (Llama3 and Llama3.1 blocks) and part of
Table 2, so bold / underline placement can be checked against the paper itself.
"""

from __future__ import annotations

import shutil
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mice_exp.errors import UserError
from mice_exp.metrics import TAU_GRID, etcu_curve
from mice_exp.report import command, tables
from mice_exp.report.collect import Predictions, collect_runs, experiment_ids
from mice_exp.report.plots import LOAO_FILE, etcu_figures, loao_comparison, loao_pairs
from mice_exp.tracking.schema import SPAN_CONFIDENCES
from mice_exp.tracking.sweeps import (
    config_hash,
    ensure_parent_run,
    find_parent_run,
    finished_run_with_config,
)

EXPERIMENT = "mice_exp"
SWEEP = "multirun/2025-01-01/00-00-00"
#: Bootstrap resamples of the reports built here: their intervals are checked for shape, not width (the published
#: 200 / 1000 cost minutes of smECE under 13 runs).
QUICK = 20
M = tables.METRICS

# Paper Table 1: smECE, Low, Medium, High, AUC
LLAMA3 = {
    "raw": (0.184, 0.351, 0.015, -0.323, 0.001),
    "hre": (0.041, 0.356, 0.033, 0.000, 0.110),
    "nwkr": (0.039, 0.356, 0.027, 0.000, 0.118),
    "mice_lr/loao": (0.036, 0.356, 0.025, 0.000, 0.114),
    "mice_rf/loao": (0.065, 0.349, 0.011, -0.016, 0.096),
    "mice_lr": (0.037, 0.356, 0.055, 0.000, 0.125),
    "mice_rf": (0.040, 0.356, 0.100, 0.024, 0.144),
}
LLAMA31 = {
    "raw": (0.229, 0.240, -0.129, -0.579, -0.127),
    "hre": (0.050, 0.229, 0.017, 0.000, 0.060),
    "nwkr": (0.032, 0.239, 0.000, 0.000, 0.063),
    "platt": (0.060, 0.200, 0.010, -0.100, 0.050),  # "any other estimator": never best or second
    "mice_lr/loao": (0.054, 0.239, 0.019, 0.000, 0.061),
    "mice_rf/loao": (0.050, 0.233, 0.051, -0.008, 0.073),
    "mice_lr": (0.050, 0.239, 0.051, 0.000, 0.071),
    "mice_rf": (0.032, 0.248, 0.072, 0.023, 0.104),
}
# Paper Table 2 (Llama3-8B-I), RF and LR with confidence only, RF first half.
ABLATION = {
    ("mice_rf", "conf_only"): (0.186, 0.330, -0.037, -0.217, 0.003),
    ("mice_rf", "first_half"): (0.035, 0.353, 0.065, -0.007, 0.127),
    ("mice_lr", "conf_only"): (0.037, 0.356, 0.035, 0.000, 0.120),
}
NAMES = {"raw": "Raw Confidence", "hre": "HRE", "nwkr": "NWKR", "platt": "Platt Scaling",
         "mice_lr": "MICE LR", "mice_rf": "MICE RF"}
DISPLAY = {"llama3_8b_instruct": "Llama3-8B-Instruct", "llama3_1_8b_instruct": "Llama3.1-8B-Instruct"}


def as_metrics(values) -> dict[str, float]:
    return dict(zip(M, values))


def predictions(seed: int, keys: list[str], n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.6).astype(int)
    frame = pd.DataFrame({"id": [f"ex{i}" for i in range(n)], "api": [f"api{i % 3}" for i in range(n)], "label": y})
    for i, key in enumerate(dict.fromkeys(keys)):
        frame[f"p_{key}"] = np.clip(0.3 + 0.4 * y + rng.normal(0, 0.2 + 0.05 * i, n), 0, 1).round(4)
    return frame


class Store:
    """A temporary project with its own copy of a migrated, empty SQLite store."""

    def __init__(self, root: Path, template: Path):
        from mlflow import MlflowClient

        self.root = root
        db = root / "mlruns" / "mlflow.db"
        db.parent.mkdir(parents=True)
        shutil.copyfile(template, db)
        self.uri = f"sqlite:///{db}"
        self.client = MlflowClient(self.uri)
        self.experiment_id = self.client.create_experiment(
            EXPERIMENT, artifact_location=(root / "mlruns" / "artifacts").as_uri())
        self.clock = 1_700_000_000_000

    def job(self, llm, estimator, protocol="holdout", features="bertscore", metrics=None, baselines=None,
            pvalues=None, status="FINISHED", sweep=None, predictions_keys=None, tags=None, start=None) -> str:
        from mlflow.entities import Metric, Param

        self.clock += 1000
        run_tags = {"llm": llm, "dataset": "ste", "features": features, "estimator": estimator,
                    "protocol": protocol, "risk": "medium", **(tags or {})}
        if sweep:
            run_tags["sweep"] = sweep
        run = self.client.create_run(self.experiment_id, start_time=start or self.clock, tags=run_tags,
                                     run_name=f"{llm}/{features}/{estimator}/{protocol}")
        run_id = run.info.run_id
        params = {"llm.name": llm, "llm.display": DISPLAY[llm], "estimator.key": estimator,
                  "estimator.name": NAMES[estimator], "features.name": features, "protocol.name": protocol}
        values = dict(metrics or {})
        for key, vals in (baselines or {}).items():
            values |= {f"baseline.{key}.{m}": v for m, v in as_metrics(vals).items()}
        values |= pvalues or {}
        self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()],
                              metrics=[Metric(k, float(v), self.clock, 0) for k, v in values.items()])
        keys = predictions_keys if predictions_keys is not None else [*(baselines or {}), estimator]
        if keys:
            self.client.log_text(run_id, predictions(len(self.client.search_runs([self.experiment_id])), keys)
                                 .to_csv(index=False), "predictions.csv")
        if status != "RUNNING":
            self.client.set_terminated(run_id, status)
        return run_id


def fill(store: Store) -> dict[str, str]:
    """Two LLMs of Table 1, the ablation runs, and runs the report must ignore."""
    ids = {}
    base3 = {k: LLAMA3[k] for k in ("raw", "hre", "nwkr")}
    loao_base = {k: tuple(v + 0.005 for v in LLAMA3[k]) for k in ("raw", "hre", "nwkr")}  # loao-trained
    rf_p = {"pvalue_smece_vs_hre": 0.5, "pvalue_smece_vs_nwkr": 0.01,  # significant but worse: no mark
            "pvalue_etcu_low_vs_hre": 1.0, "pvalue_etcu_low_vs_nwkr": 1.0,
            "pvalue_etcu_medium_vs_hre": 0.2, "pvalue_etcu_medium_vs_nwkr": 0.01,
            "pvalue_etcu_high_vs_hre": 0.01, "pvalue_etcu_high_vs_nwkr": 0.02,
            "pvalue_auc_etcu_vs_hre": 0.001, "pvalue_auc_etcu_vs_nwkr": 0.001}
    lr_p = {f"pvalue_{m}_vs_{r}": 0.5 for m in M for r in ("hre", "nwkr")} | {"pvalue_auc_etcu_vs_hre": 0.01}
    llm = "llama3_8b_instruct"
    # an older MICE RF run of the same key, superseded by the newer one below
    ids["old_rf"] = store.job(llm, "mice_rf", metrics=as_metrics((0.5,) * 5), baselines=base3)
    ids["rf"] = store.job(llm, "mice_rf", metrics=as_metrics(LLAMA3["mice_rf"]), baselines=base3, pvalues=rf_p)
    ids["lr"] = store.job(llm, "mice_lr", metrics=as_metrics(LLAMA3["mice_lr"]), baselines=base3, pvalues=lr_p)
    ids["rf_loao"] = store.job(llm, "mice_rf", "loao", metrics=as_metrics(LLAMA3["mice_rf/loao"]),
                               baselines=loao_base, pvalues={"pvalue_auc_etcu_vs_hre": 0.01})  # worse: no mark
    ids["lr_loao"] = store.job(llm, "mice_lr", "loao", metrics=as_metrics(LLAMA3["mice_lr/loao"]),
                               baselines=loao_base)
    for (est, feats), vals in ABLATION.items():  # newer, with other baseline values: must not fill Table 1
        ids[f"{est}_{feats}"] = store.job(llm, est, features=feats, metrics=as_metrics(vals),
                                          baselines={k: (0.9,) * 5 for k in base3})
    # ignored: a newer FAILED and a RUNNING run of the RF key, and a FINISHED stage=llm run
    ids["failed"] = store.job(llm, "mice_rf", metrics=as_metrics((0.9,) * 5), baselines=base3, status="FAILED")
    ids["running"] = store.job(llm, "mice_rf", metrics=as_metrics((0.9,) * 5), baselines=base3, status="RUNNING")
    ids["llm_only"] = store.job(llm, "mice_lr", features="pca10", metrics={"llm_accuracy": 0.5}, predictions_keys=[])
    # collected, but no Table 1 row: another protocol's results
    ids["sample_eff"] = store.job(llm, "mice_rf", "sample_efficiency", metrics=as_metrics((0.7,) * 5),
                                  baselines=base3)

    llm = "llama3_1_8b_instruct"
    base31 = {k: LLAMA31[k] for k in ("raw", "hre", "nwkr")}
    ids["rf31"] = store.job(llm, "mice_rf", metrics=as_metrics(LLAMA31["mice_rf"]), baselines=base31, sweep=SWEEP)
    ids["lr31"] = store.job(llm, "mice_lr", metrics=as_metrics(LLAMA31["mice_lr"]), baselines=base31, sweep=SWEEP)
    ids["platt31"] = store.job(llm, "platt", metrics=as_metrics(LLAMA31["platt"]), baselines=base31, sweep=SWEEP)
    for est in ("mice_rf", "mice_lr"):
        ids[f"{est}_loao31"] = store.job(llm, est, "loao", metrics=as_metrics(LLAMA31[f"{est}/loao"]),
                                         baselines=base31, sweep=SWEEP)
    return ids


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """An empty SQLite store migrated once (MLflow's migrations take seconds); tests copy it."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture(scope="module")
def filled(template, tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("proj"), template)
    return store, fill(store)


@pytest.fixture(scope="module")
def report(filled):
    store, _ = filled
    return command.build_report(store.client, EXPERIMENT, resamples=QUICK)


@pytest.fixture
def fresh(template, tmp_path):
    return Store(tmp_path / "proj", template)


def block(frame: pd.DataFrame, llm: str) -> pd.DataFrame:
    return frame[frame["llm"] == llm].set_index("row")


# ----------------------------------------------------------------------------- collection


def test_collect_keeps_the_latest_finished_estimation_run_per_key(filled):
    store, ids = filled
    records = collect_runs(store.client, experiment_ids(store.client, EXPERIMENT))
    found = {r.run_id for r in records}
    assert ids["rf"] in found and ids["old_rf"] not in found  # latest of the key
    assert not found & {ids["failed"], ids["running"], ids["llm_only"]}
    assert len(records) == 13
    rf = next(r for r in records if r.run_id == ids["rf"])
    assert (rf.llm_display, rf.estimator_name, rf.baseline_keys()) == ("Llama3-8B-Instruct", "MICE RF",
                                                                       ["hre", "nwkr", "raw"])
    swept = collect_runs(store.client, experiment_ids(store.client, EXPERIMENT), SWEEP + "/")
    assert {r.llm for r in swept} == {"llama3_1_8b_instruct"} and len(swept) == 5
    with pytest.raises(UserError, match="recent sweeps: " + SWEEP):
        collect_runs(store.client, experiment_ids(store.client, EXPERIMENT), "multirun/nope")
    with pytest.raises(UserError, match="no MLflow experiment named 'nope'"):
        experiment_ids(store.client, "nope")


# ----------------------------------------------------------------------------- Table 1


def test_table1_rows_numbers_and_order_follow_the_paper(report, filled):
    _, ids = filled
    t = report.table1
    assert list(t["llm_display"].drop_duplicates()) == ["Llama3-8B-Instruct", "Llama3.1-8B-Instruct"]
    llama3 = block(t, "llama3_8b_instruct")
    assert list(llama3.index) == ["Raw Confidence", "HRE", "NWKR", "MICE LR Zeroshot", "MICE RF Zeroshot",
                                  "MICE LR", "MICE RF"]
    expected = {"Raw Confidence": "raw", "HRE": "hre", "NWKR": "nwkr", "MICE LR Zeroshot": "mice_lr/loao",
                "MICE RF Zeroshot": "mice_rf/loao", "MICE LR": "mice_lr", "MICE RF": "mice_rf"}
    for row, key in expected.items():
        assert llama3.loc[row, list(M)].tolist() == pytest.approx(LLAMA3[key])
    # reference rows come from the holdout bertscore runs, not the (newer) ablation or loao runs
    assert set(llama3.loc[["Raw Confidence", "HRE", "NWKR"], "source"]) == {"baseline"}
    assert llama3.loc["HRE", "run_id"] in (ids["rf"], ids["lr"])
    assert llama3.loc["MICE RF", "run_id"] == ids["rf"]
    assert set(llama3["features"]) == {"bertscore"}
    llama31 = block(t, "llama3_1_8b_instruct")
    assert list(llama31.index) == ["Raw Confidence", "HRE", "NWKR", "Platt Scaling", "MICE LR Zeroshot",
                                   "MICE RF Zeroshot", "MICE LR", "MICE RF"]
    assert llama31.loc["Platt Scaling", "source"] == "run"


def styles(frame: pd.DataFrame, llm: str, metric: str, style: str) -> set[str]:
    b = block(frame, llm)
    return set(b.index[b[f"{metric}_style"] == style])


def test_bold_and_underline_are_placed_as_in_the_paper(report):
    t = report.table1
    l3, l31 = "llama3_8b_instruct", "llama3_1_8b_instruct"
    assert styles(t, l3, "smece", "bold") == {"MICE LR Zeroshot"}
    assert styles(t, l3, "smece", "underline") == {"MICE LR"}
    assert styles(t, l3, "etcu_low", "bold") == {"HRE", "NWKR", "MICE LR Zeroshot", "MICE LR", "MICE RF"}
    assert styles(t, l3, "etcu_low", "underline") == {"Raw Confidence"}
    assert styles(t, l3, "etcu_medium", "bold") == {"MICE RF"}
    assert styles(t, l3, "etcu_medium", "underline") == {"MICE LR"}
    assert styles(t, l3, "etcu_high", "underline") == {"HRE", "NWKR", "MICE LR Zeroshot", "MICE LR"}
    assert (styles(t, l3, "auc_etcu", "bold"), styles(t, l3, "auc_etcu", "underline")) == ({"MICE RF"}, {"MICE LR"})
    # ties on the printed value share the style: two bold 0.032, three underlined 0.050
    assert styles(t, l31, "smece", "bold") == {"NWKR", "MICE RF"}
    assert styles(t, l31, "smece", "underline") == {"HRE", "MICE RF Zeroshot", "MICE LR"}
    assert styles(t, l31, "etcu_low", "underline") == {"Raw Confidence"}
    assert styles(t, l31, "etcu_medium", "underline") == {"MICE RF Zeroshot", "MICE LR"}


def test_marks_need_a_small_p_value_and_a_better_value(report):
    l3 = block(report.table1, "llama3_8b_instruct")
    marks = {row: l3.loc[row, [f"{m}_mark" for m in M]].tolist() for row in l3.index}
    assert marks["MICE RF"] == ["", "", "†", "*†", "*†"]  # smECE: p = 0.01 vs NWKR but worse
    assert marks["MICE LR"] == ["", "", "", "", "*"]
    assert marks["MICE RF Zeroshot"] == [""] * 5  # p = 0.01 on AUC but below its HRE
    assert all(marks[r] == [""] * 5 for r in ("Raw Confidence", "HRE", "NWKR"))


def test_rank_styles_and_number_format():
    assert tables.rank_styles([0.1, 0.3, 0.3, 0.2, float("nan")], lower_is_better=False) == \
        ["", "bold", "bold", "underline", ""]
    assert tables.rank_styles([0.0404, 0.0396, 0.05], lower_is_better=True) == ["bold", "bold", "underline"]
    assert tables.rank_styles([-0.0001, 0.0, -0.3], lower_is_better=False) == ["bold", "bold", "underline"]
    assert tables.rank_styles([0.2], lower_is_better=True) == ["bold"]
    assert (tables.fmt(-0.0001), tables.fmt(-0.0234), tables.fmt(float("nan"))) == ("0.000", "-0.023", "–")
    assert tables.cell(0.0241, "bold", "*†") == "**0.024** \\*†"
    assert tables.cell(0.051, "underline", "†") == "<u>0.051</u> †"


def test_markdown_renders_the_paper_layout(report):
    md = report.markdown
    assert md.startswith("# mice_exp results")
    assert "## Table 1: results on the test set (ste; features `bertscore`)" in md
    assert "| Model | Confidence Estimator | smECE (↓) | Low risk (↑) | Medium risk (↑) | High risk (↑) | AUC (↑) |" in md
    lines = md.splitlines()
    assert "| Llama3-8B-Instruct | Raw Confidence | 0.184 | <u>0.351</u> | 0.015 | -0.323 | 0.001 |" in lines
    assert "|  | MICE RF | 0.040 | **0.356** | **0.100** † | **0.024** \\*† | **0.144** \\*† |" in lines
    assert "|  | MICE LR | <u>0.037</u> | **0.356** | <u>0.055</u> | <u>0.000</u> | <u>0.125</u> \\* |" in lines
    assert "| Llama3.1-8B-Instruct | Raw Confidence | 0.229 | <u>0.240</u> | -0.129 | -0.579 | -0.127 |" in lines
    assert "## Table 2: feature ablation (ste)" in md
    assert "| Base LLM | MICE Model |" in md
    assert "![loao_auc.png](loao_auc.png)" in md and "![etcu_ste_llama3_8b_instruct.png]" in md


def one_run_report(store: Store, metrics: dict[str, float], baselines: dict | None = None) -> command.Report:
    """The report of one Llama3 MICE RF run with Table 1's metrics and ``metrics``."""
    store.job("llama3_8b_instruct", "mice_rf", metrics=as_metrics(LLAMA3["mice_rf"]) | metrics, baselines=baselines)
    return command.build_report(store.client, EXPERIMENT, with_figures=False)


def test_selective_table_shows_prr_and_aurc_beside_smece_and_auc_etcu(template, tmp_path):
    store = Store(tmp_path / "proj", template)
    base = {k: LLAMA3[k] for k in ("raw", "hre", "nwkr")}
    selective = {"prr": 0.4, "aurc": 0.2, "baseline.raw.prr": 0.1, "baseline.raw.aurc": 0.3,
                 "baseline.hre.prr": 0.2, "baseline.hre.aurc": 0.25}  # nwkr logged before PRR existed
    lines = one_run_report(store, selective, base).markdown.splitlines()
    assert "| Model | Confidence Estimator | smECE (↓) | AUC-ETCU (↑) | PRR (↑) | AURC (↓) |" in lines
    assert "| Llama3-8B-Instruct | Raw Confidence | 0.184 | 0.001 | 0.100 | 0.300 |" in lines
    assert "|  | NWKR | **0.039** | <u>0.118</u> | – | – |" in lines
    assert "|  | MICE RF | <u>0.040</u> | **0.144** | **0.400** | **0.200** |" in lines
    # Table 1 itself keeps the paper's five columns.
    assert "| Model | Confidence Estimator | smECE (↓) | Low risk (↑) | Medium risk (↑) | High risk (↑) | AUC (↑) |" in lines


def test_the_report_shows_per_argument_confidence_per_llm(template, tmp_path):
    store = Store(tmp_path / "proj", template)
    spans = {"argument.n": 120, "argument.accuracy": 0.8, "argument.auroc": 0.71, "argument.smece": 0.12,
             "argument.localization": 0.6, "argument.localization_chance": 0.55, "argument.lens_auroc": float("nan"),
             "api_name.n": 190, "api_name.accuracy": 0.9, "api_name.auroc": 0.65, "api_name.smece": 0.05}  # no lens ids
    report = one_run_report(store, spans)
    lines = report.markdown.splitlines()
    row = "| Llama3-8B-Instruct | ste | "
    assert "## Per-argument confidence" in lines
    assert row + "argument values | token-probability product | 120 | 0.800 | 0.710 | 0.120 | 0.600 | 0.550 |" in lines
    assert row + "argument values | logit-lens agreement | 120 | 0.800 | – | – | – | 0.550 |" in lines
    assert row + "API name | token-probability product | 190 | 0.900 | 0.650 | 0.050 | – | – |" in lines
    assert len(report.csv[report.csv["table"] == "arguments"]) == 2 * len(SPAN_CONFIDENCES)  # 2 spans x the rules


# ----------------------------------------------------------------------------- Table 2, CSV


def test_ablation_table_groups_rows_per_estimator(report):
    a = report.ablation
    assert set(a["llm"]) == {"llama3_8b_instruct"}  # Llama3.1 has one feature set per estimator
    assert list(a["row"]) == ["RF Confidence Only", "RF First Half Layers + Confidence", "RF",
                              "LR Confidence Only", "LR"]
    assert list(a["features"]) == ["conf_only", "first_half", "bertscore", "conf_only", "bertscore"]
    rf = a[a["estimator"] == "mice_rf"].set_index("row")
    assert rf.loc["RF First Half Layers + Confidence", list(M)].tolist() == pytest.approx(
        ABLATION[("mice_rf", "first_half")])
    assert rf["smece_style"].tolist() == ["", "bold", "underline"]
    assert rf["etcu_low_style"].tolist() == ["", "underline", "bold"]
    lr = a[a["estimator"] == "mice_lr"].set_index("row")
    assert lr["smece_style"].tolist() == ["bold", "bold"]  # 0.037 and 0.037: ranked within LR only
    assert lr["etcu_medium_style"].tolist() == ["underline", "bold"]
    assert (a[[f"{m}_mark" for m in M]] == "").all().all()


def test_csv_has_both_tables_and_fixed_columns(report, filled, tmp_path):
    paths = report.write(tmp_path)
    assert {p.name for p in paths} == {"results.md", "results.csv", "predictions.csv", "etcu_ste_llama3_8b_instruct.png",
                                       "etcu_ste_llama3_1_8b_instruct.png", LOAO_FILE}
    assert all(p.stat().st_size > 0 for p in paths)
    frame = pd.read_csv(tmp_path / "results.csv", keep_default_na=False, na_values=[""])
    # Table 1's columns first, then each cell's 95% bootstrap interval (from the runs' predictions);
    # the selective table adds PRR and AURC (and their styles) after them, the paper's-terms table its
    # accuracy, auc-euro and gains over raw confidence and NWKR with their intervals.
    intervals = [f"{m}_{end}" for m in M for end in ("lo", "hi")]
    gains = [f"gain_{m}_vs_{r}{end}" for r in ("raw", "nwkr") for m in ("smece", "auc_etcu") for end in ("", "_lo", "_hi")]
    assert list(frame.columns) == [*tables.COLUMNS, *intervals, "prr", "aurc", "prr_style", "aurc_style", "n_test",
                                   "accuracy", "auc_euro", *gains]
    assert frame.columns[:10].tolist() == ["table", "dataset", "llm", "llm_display", "row", "estimator",
                                          "protocol", "features", "source", "run_id"]
    # gains for Table 1's 15 rows and the 3 ablation rows that are not Table-1 runs (RF conf_only / first
    # half, LR conf_only; the ablation's "RF" and "LR" are Table 1's MICE RF / LR runs)
    assert frame["table"].value_counts().to_dict() == {"table1": 15, "selective": 15, "paper_terms": 18, "ablation": 5}
    rf = frame[(frame["table"] == "table1") & (frame["row"] == "MICE RF") & (frame["llm"] == "llama3_8b_instruct")]
    assert rf[list(M)].iloc[0].tolist() == pytest.approx(LLAMA3["mice_rf"])
    assert (rf["auc_etcu_lo"] <= rf["auc_etcu_hi"]).all()
    assert rf[["etcu_high_mark", "etcu_high_style"]].iloc[0].tolist() == ["*†", "bold"]
    assert rf["etcu_high_p_hre"].iloc[0] < 0.05  # the p-value behind the mark, published beside it
    long = pd.read_csv(tmp_path / "predictions.csv")
    assert long.groupby("row").size().min() == 60 and set(long.columns) >= {"id", "confidence", "label", "run_id"}
    # every row of both tables, so an ablation cell is checkable from the file as a Table-1 cell is
    assert long[["table", "llm", "row"]].drop_duplicates()["table"].value_counts().to_dict() == {"table1": 15,
                                                                                              "ablation": 5}
    half = long[(long["table"] == "ablation") & (long["row"] == "RF First Half Layers + Confidence")]
    with Predictions(filled[0].client) as preds:
        logged = preds(half["run_id"].iloc[0])
    assert half["confidence"].tolist() == pytest.approx(logged["p_mice_rf"].tolist())  # its run's own predictions


# ----------------------------------------------------------------------------- figures


def test_etcu_curves_are_recomputed_from_the_predictions_artifacts(report, filled):
    store, ids = filled
    t = report.table1[report.table1["llm"] == "llama3_8b_instruct"]
    with Predictions(store.client) as preds:
        figs = etcu_figures(t, preds)
        frame = preds(ids["rf"])
    fig = figs["etcu_ste_llama3_8b_instruct.png"]
    gids = [line.get_gid() for line in fig.axes[0].lines]
    assert [g for g in gids if g.startswith("curve:")] == [f"curve:{r}" for r in t["row"]]
    assert sorted(g for g in gids if g.startswith("policy:")) == [
        "policy:always_abstain", "policy:always_execute", "policy:base_rate", "policy:oracle"]
    line = next(ln for ln in fig.axes[0].lines if ln.get_gid() == "curve:MICE RF")
    assert line.get_ydata() == pytest.approx(etcu_curve(frame["p_mice_rf"], frame["label"], TAU_GRID))


def test_loao_comparison_pairs_holdout_with_zeroshot(report):
    panels = loao_pairs(report.table1)
    assert panels["Llama3-8B-Instruct (ste)"] == [("MICE LR", 0.125, 0.114), ("MICE RF", 0.144, 0.096)]
    fig = loao_comparison(panels)
    gids = {p.get_gid() for ax in fig.axes for p in ax.patches if p.get_gid()}
    assert "bar:Llama3-8B-Instruct (ste):MICE RF:zeroshot" in gids and len(gids) == 8


# ----------------------------------------------------------------------------- the command


def test_report_command_logs_a_report_run_and_writes_the_folder(filled, tmp_path, monkeypatch, capsys):
    store, _ = filled  # the report and parent runs added here are not jobs: other tests still see 13
    monkeypatch.setattr(command, "project_root", lambda: store.root)
    command.report(["--tracking-uri", store.uri, "--preset", "table1", "--resamples", str(QUICK)])
    out = store.root / "experiments" / "table1"
    assert (out / "results.md").read_text().startswith("# mice_exp results")
    assert f"95% paired bootstrap interval ({QUICK} resamples of the test calls" in (out / "results.md").read_text()
    assert (out / LOAO_FILE).is_file()
    runs = store.client.search_runs([store.experiment_id], "tags.report = 'true'")
    assert len(runs) == 1 and runs[0].info.run_name == "report" and runs[0].info.status == "FINISHED"
    logged = {a.path for a in store.client.list_artifacts(runs[0].info.run_id, "report")}
    assert {"report/results.md", "report/results.csv", f"report/{LOAO_FILE}"} <= logged
    printed = capsys.readouterr().out
    assert "| Llama3-8B-Instruct | Raw Confidence |" in printed and "## Selective prediction" in printed
    assert "## On the paper's terms" in printed and "### The paper's own gains" in printed  # as the README says
    assert f"/#/experiments/{store.experiment_id}/runs/{runs[0].info.run_id}?workflowType=machine_learning" in printed
    # a second report does not read the first report's run as a job
    assert len(command.build_report(store.client, EXPERIMENT, with_figures=False).records) == 13

    # a sweep with a parent run: the report goes to the parent, no new report run
    parent = ensure_parent_run({"uri": store.uri, "experiment": EXPERIMENT}, store.root, SWEEP,
                               ["llm=llama3_1_8b_instruct", "estimator=mice_rf,mice_lr"])
    command.report(["--tracking-uri", store.uri, "--sweep", SWEEP, "--no-log", "--resamples", str(QUICK)])
    assert len(store.client.search_runs([store.experiment_id], "tags.report = 'true'")) == 1
    command.report(["--tracking-uri", store.uri, "--sweep", SWEEP, "--out", str(tmp_path / "out"),
                    "--resamples", str(QUICK)])
    assert len(store.client.search_runs([store.experiment_id], "tags.report = 'true'")) == 1
    logged = {a.path for a in store.client.list_artifacts(parent, "report")}
    assert "report/results.md" in logged and "report/etcu_ste_llama3_1_8b_instruct.png" in logged
    ours = (tmp_path / "out" / "results.md").read_text().split("### The paper's own gains")[0]
    assert "Llama3-8B" not in ours and "Llama3.1-8B" in ours  # only the sweep's runs (the paper's quoted below)
    assert (tmp_path / "out" / "results.csv").is_file()


def test_a_report_replaces_an_earlier_one_only_when_forced(tmp_path, monkeypatch):
    """A published report (results.md, results.csv, predictions.csv) is not overwritten by accident."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.md").write_text("# an earlier report\n")
    with pytest.raises(UserError, match=r"--out old: .* already holds a report \(results.md\); expected --force"):
        command.output_folder(command.parse_args(["--out", "old"]), Path("/r"))
    assert command.output_folder(command.parse_args(["--out", "old", "--force"]), Path("/r")) == tmp_path / "old"
    assert command.output_folder(command.parse_args(["--out", "new"]), Path("/r")) == tmp_path / "new"


def test_a_forced_report_clears_the_earlier_reports_figures_and_names_every_file_it_writes(filled, tmp_path,
                                                                                           monkeypatch, capsys):
    """--force into a folder holding another LLM's report leaves none of its figures beside the new results;
    files that are not a report's (a README) stay."""
    store, _ = filled
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "old"
    out.mkdir()
    for name in ("results.md", "etcu_ste_gemma3_270m.png", "README.md"):
        (out / name).write_text("an earlier report's\n")
    command.report(["--tracking-uri", store.uri, "--sweep", SWEEP, "--no-log", "--out", "old", "--force",
                    "--resamples", str(QUICK)])
    assert "removed the earlier report's etcu_ste_gemma3_270m.png" in capsys.readouterr().out
    assert not (out / "etcu_ste_gemma3_270m.png").exists() and (out / "README.md").read_text() == "an earlier report's\n"
    written = sorted(p.name for p in out.iterdir() if p.name != "README.md")
    assert "etcu_ste_llama3_1_8b_instruct.png" in written and (out / "results.md").read_text() != "an earlier report's\n"
    assert all(any(fnmatch(name, pattern) for pattern in command.WRITES) for name in written), written


def test_report_arguments_are_checked(fresh, monkeypatch):
    with pytest.raises(UserError, match="invalid arguments"):
        command.report(["--preset", "a", "--out", "b"])
    with pytest.raises(UserError, match="expected a folder name"):
        command.output_folder(command.parse_args(["--preset", "../x"]), Path("/r"))
    with pytest.raises(UserError, match="--resamples 1; expected at least 2 bootstrap resamples"):
        command.parse_args(["--resamples", "1"])
    assert command.output_folder(command.parse_args(["--preset", "t1"]), Path("/r")) == Path("/r/experiments/t1")
    with pytest.raises(UserError, match="no FINISHED run with estimation metrics in experiment 'mice_exp'"):
        command.report(["--tracking-uri", fresh.uri, "--no-log"])


# ----------------------------------------------------------------------------- sweeps


def test_parent_run_is_created_once_with_the_overrides(fresh):
    cfg = {"uri": fresh.uri, "experiment": EXPERIMENT}
    first = ensure_parent_run(cfg, fresh.root, SWEEP, ["seed=0,1", "estimator=mice_rf"])
    assert ensure_parent_run(cfg, fresh.root, SWEEP, ["ignored"]) == first
    run = fresh.client.get_run(first)
    assert run.data.tags["sweep_parent"] == "true" and run.data.tags["sweep"] == SWEEP
    assert run.data.tags["sweep.overrides"] == "seed=0,1 estimator=mice_rf"
    assert run.info.status == "FINISHED"
    assert find_parent_run(fresh.client, [fresh.experiment_id], SWEEP) == first
    assert find_parent_run(fresh.client, [fresh.experiment_id], "multirun/other") is None
    assert ensure_parent_run({**cfg, "enabled": False}, fresh.root, SWEEP) is None


def test_finished_run_with_config_finds_only_finished_runs_of_that_config(fresh):
    cfg = {"llm": {"name": "x", "layers": [1, 2]}, "seed": 0, "tracking": {"uri": None}, "paths": {"root": "/a"}}
    digest = config_hash(cfg)
    same = {"seed": 0, "paths": {"root": "/elsewhere"}, "llm": {"layers": [1, 2], "name": "x"}}
    assert config_hash(same) == digest  # key order, storage places do not count
    assert config_hash({**cfg, "seed": 1}) != digest
    assert config_hash({**cfg, "n_jobs": 2}) == digest  # how many processes test, not what they compute
    assert config_hash({**cfg, "llm": {**cfg["llm"], "shards": 4, "shard": 1}}) == digest  # nor generate
    exp = fresh.experiment_id
    assert finished_run_with_config(fresh.client, exp, digest) is None
    fresh.job("llama3_8b_instruct", "mice_rf", metrics={"auc_etcu": 0.1}, status="FAILED",
              tags={"config_hash": digest}, predictions_keys=[])
    fresh.job("llama3_8b_instruct", "mice_rf", metrics={"auc_etcu": 0.1}, status="RUNNING",
              tags={"config_hash": digest}, predictions_keys=[])
    assert finished_run_with_config(fresh.client, exp, digest) is None
    done = fresh.job("llama3_8b_instruct", "mice_rf", metrics={"auc_etcu": 0.1},
                     tags={"config_hash": digest}, predictions_keys=[])
    fresh.job("llama3_8b_instruct", "mice_lr", metrics={"auc_etcu": 0.1},
              tags={"config_hash": config_hash({**cfg, "seed": 1})}, predictions_keys=[])
    assert finished_run_with_config(fresh.client, exp, digest) == done


def custom_risk_run(fresh, llm: str, utilities: dict[str, float], values: tuple[float, float]) -> None:
    """A ``risk=custom`` holdout run of MICE RF with its HRE row, as a job logs it: the utilities among its params."""
    run = fresh.job(llm, "mice_rf", tags={"risk": "custom"}, metrics={"auc_etcu": 0.1, "etcu_custom": values[0],
                                                                       "baseline.hre.etcu_custom": values[1]})
    for key, value in utilities.items():
        fresh.client.log_param(run, f"risk.{key}", value)


def test_the_risk_sweep_places_each_run_at_its_risk_s_own_threshold(fresh):
    """Utilities other than tp = 1, tn = fn = 0 move tau off -fp / (1 - fp): the sweep uses the risk's own."""
    from mice_exp.metrics import Risk

    utilities = {"tp": 2, "fp": -1, "tn": 0.5, "fn": 0}
    custom_risk_run(fresh, "llama3_8b_instruct", utilities, (0.30, 0.20))
    report = command.build_report(fresh.client, EXPERIMENT)
    taus = report.csv.loc[report.csv["table"] == "risk_sweep", "tau"]
    assert set(taus) == {Risk(**utilities).tau} and round(Risk(**utilities).tau, 2) == 0.43  # not 1 / (1 + 1)
    assert "τ=0.43" in report.markdown and "each run's utilities" in report.markdown


def test_the_report_adds_the_risk_sweep_action_belief_field_and_sample_efficiency_sections(fresh, tmp_path):
    """Runs of the other presets carry their results in metrics and artifacts; each gets its section."""
    llm = "llama3_8b_instruct"
    for fp, values in ((-0.25, (0.30, 0.20)), (-4.0, (0.05, -0.10))):
        custom_risk_run(fresh, llm, {"tp": 1, "fp": fp, "tn": 0, "fn": 0}, values)
    belief = {"auc_etcu": 0.1, "agent.act_rate": 0.75, **{f"agent.etcu_{r}": 0.1 for r in ("low", "medium", "high")}}
    for key, rho in (("raw", -0.4), ("mice_lr", 0.6)):
        belief |= {f"action_belief.{key}.spearman": rho,
                   **{f"action_belief.{key}.agree_{r}": 0.5 for r in ("low", "medium", "high")}}
    fresh.job(llm, "mice_lr", metrics=belief)
    field = {"auc_etcu": 0.2, "baseline.mice_rf.auc_etcu": 0.15, "field.frac_over": 0.25, "field.frac_under": 0.1,
             "field.worst_slice_gap": 0.07, "field.n_test": 40, "field.alpha": 1.5,
             **{f"field.{m}_all_{w}": 0.2 for m in ("smece", "brier") for w in ("base", "field")}}
    run = fresh.job(llm, "mice_rf", features="pca10", metrics=field, tags={"estimator": "field_mice_rf"})
    fresh.client.log_param(run, "estimator.base", "mice_rf")
    se = fresh.job(llm, "mice_rf", protocol="sample_efficiency", predictions_keys=[])
    table = pd.DataFrame({"estimator": ["mice_rf", "mice_rf"], "size": [25, 50], "n_groups": [4, 2], "trials": [3, 3],
                          "mean": [0.1, 0.2], "var": [0.01, 0.0025], "std": [0.1, 0.05]})
    fresh.client.log_text(se, table.to_csv(index=False), "sample_efficiency.csv")
    fits = pd.DataFrame({"estimator": "mice_rf", "size": 25, "trial": [0, 0], "group": [0, 1], "auc_etcu": [0.1, 0.2],
                         "fallback": False})
    fresh.client.log_text(se, fits.to_csv(index=False), "sample_efficiency_fits.csv")

    report = command.build_report(fresh.client, EXPERIMENT)
    text = report.markdown
    assert "## Utility against the risk level" in text and "τ=0.20" in text and "τ=0.80" in text
    assert "| MICE RF | 0.300 | 0.050 |" in text and "| HRE | 0.200 | -0.100 |" in text
    assert "calls an API on 75% of the test queries" in text and "| MICE LR | 0.600 |" in text
    assert "| Raw Confidence | -0.400 |" in text
    assert "| Llama3-8B-Instruct | MICE RF | 40 | 25% | 10% | 0.070 |" in text
    assert "| MICE RF | 0.100 ± 0.100 | 0.200 ± 0.050 |" in text
    written = {p.name for p in report.write(tmp_path / "out")}
    assert {"risk_sweep_llama3_8b_instruct.png", "sample_efficiency_llama3_8b_instruct.png"} <= written
    assert set(report.csv["table"]) >= {"risk_sweep", "action_belief", "field", "sample_efficiency"}
    published = pd.read_csv(tmp_path / "out" / "sample_efficiency_fits.csv.gz")
    assert published["auc_etcu"].tolist() == [0.1, 0.2] and set(published["llm"]) == {"Llama3-8B-Instruct"}


def test_a_multi_turn_run_gets_its_trajectory_section(fresh):
    """A run on a multi-turn data set's steps also scores whole conversations; the report shows each confidence."""
    scores = {f"{a}_{s}": v for a in ("product", "min") for s, v in
              (("brier", 0.12), ("log_loss", 0.4), ("smece", 0.05), ("auroc", 0.81))}
    metrics = {"auc_etcu": 0.1, "trajectory.n": 12, "trajectory.right_rate": 0.25,
               **{f"trajectory.{k}.{name}": v for k in ("raw", "mice_rf") for name, v in scores.items()}}
    fresh.job("llama3_8b_instruct", "mice_rf", metrics=metrics)
    text = command.build_report(fresh.client, EXPERIMENT).markdown
    assert "## Trajectories" in text
    assert "| Llama3-8B-Instruct | ste | 12 (25% right) | MICE RF | 0.120 | 0.400 | 0.050 | 0.810 |" in text
    assert "| Raw Confidence |" in text.split("## Trajectories")[1]


def test_a_sweep_report_includes_the_runs_its_skipped_jobs_reused(fresh):
    """A preset whose jobs another sweep already ran skips them; its report still shows them."""
    from mice_exp.tracking.sweeps import mark_reused

    earlier = fresh.job("llama3_8b_instruct", "mice_rf", metrics=as_metrics(LLAMA3["mice_rf"]), sweep="sweep/a",
                        baselines={k: LLAMA3[k] for k in ("raw", "hre", "nwkr")})
    own = fresh.job("llama3_8b_instruct", "mice_lr", metrics=as_metrics(LLAMA3["mice_lr"]), sweep="sweep/b")
    mark_reused(fresh.client, earlier, "sweep/b")
    records = command.build_report(fresh.client, EXPERIMENT, sweep="sweep/b", with_figures=False).records
    assert {r.run_id for r in records} == {earlier, own}
    assert [r.run_id for r in command.build_report(fresh.client, EXPERIMENT, sweep="sweep/a").records] == [earlier]


def test_a_sweep_with_only_sample_efficiency_runs_gets_its_report_and_report_run(fresh, monkeypatch):
    run = fresh.job("llama3_8b_instruct", "mice_rf", protocol="sample_efficiency", predictions_keys=[])
    table = pd.DataFrame({"estimator": ["mice_rf"], "size": [25], "n_groups": [4], "trials": [3], "mean": [0.1],
                          "var": [0.01], "std": [0.1]})
    fresh.client.log_text(run, table.to_csv(index=False), "sample_efficiency.csv")
    monkeypatch.setattr(command, "project_root", lambda: fresh.root)
    command.report(["--tracking-uri", fresh.uri, "--preset", "sample_efficiency"])
    text = (fresh.root / "experiments" / "sample_efficiency" / "results.md").read_text()
    assert "| MICE RF | 0.100 ± 0.100 |" in text and "Table 1" not in text
    assert fresh.client.search_runs([fresh.experiment_id], "tags.report = 'true'")


def test_a_zero_shot_mark_never_sits_next_to_a_better_displayed_baseline():
    """The LOAO run beat its own (logged) HRE with p < 0.05, but the HRE row the table shows is better."""
    zeroshot = {"smece": 0.149, "pvalue_smece_vs_hre": 0.001, "baseline.hre.smece": 0.30,
                "pvalue_smece_vs_nwkr": 0.001, "baseline.nwkr.smece": 0.20}
    displayed = {"baseline.hre.smece": 0.061, "baseline.nwkr.smece": 0.053}
    assert tables.significance_marks(zeroshot, "smece") == "*†"  # against its own baselines only
    assert tables.significance_marks(zeroshot, "smece", displayed) == ""
    assert tables.significance_marks(zeroshot | {"smece": 0.05}, "smece", displayed) == "*†"


# ----------------------------------------------------------------------------- the paper's terms


def test_gains_over_raw_and_nwkr_are_paired_bootstrap_differences():
    from mice_exp.metrics import auc_etcu, smece
    from mice_exp.report.paper_terms import long_predictions, paper_terms

    frame = predictions(0, ["raw", "nwkr", "mice_rf"], n=120)
    table = pd.DataFrame({"table": "table1", "dataset": "ste", "llm": "x", "row": ["Raw", "NWKR", "MICE RF"],
                          "estimator": ["raw", "nwkr", "mice_rf"], "protocol": "holdout", "features": "bertscore",
                          "run_id": "r1"})
    terms = paper_terms(long_predictions(table, lambda run_id: frame), n_resamples=200).set_index("estimator")
    y = frame["label"].to_numpy()
    rf, raw = frame["p_mice_rf"].to_numpy(), frame["p_raw"].to_numpy()
    assert terms.loc["mice_rf", "gain_smece_vs_raw"] == pytest.approx(smece(raw, y) - smece(rf, y))
    assert terms.loc["mice_rf", "gain_auc_etcu_vs_raw"] == pytest.approx(auc_etcu(rf, y) - auc_etcu(raw, y))
    for ref in ("raw", "nwkr"):
        for metric in ("smece", "auc_etcu"):
            name = f"gain_{metric}_vs_{ref}"
            low, point, high = terms.loc["mice_rf", [f"{name}_lo", name, f"{name}_hi"]]
            assert low < point < high
            assert terms.loc[ref, [f"{name}_lo", name, f"{name}_hi"]].tolist() == [0, 0, 0]  # against itself
    assert terms.loc["raw", "accuracy"] == pytest.approx(y.mean())


def test_gains_can_be_taken_over_any_holdout_row():
    """experiments/cross_model prices judging with another model's internals against the actor's own MICE RF."""
    from mice_exp.metrics import auc_etcu
    from mice_exp.report.paper_terms import long_predictions, paper_terms

    frame = predictions(0, ["raw", "mice_rf"], n=120)
    table = pd.DataFrame({"table": "table1", "dataset": "ste", "llm": "x", "row": ["Raw", "MICE RF"],
                          "estimator": ["raw", "mice_rf"], "protocol": "holdout", "features": "bertscore",
                          "run_id": "r1"})
    terms = paper_terms(long_predictions(table, lambda run_id: frame), n_resamples=50,
                        references=("mice_rf",)).set_index("estimator")
    y, rf, raw = frame["label"].to_numpy(), frame["p_mice_rf"].to_numpy(), frame["p_raw"].to_numpy()
    assert terms.loc["raw", "gain_auc_etcu_vs_mice_rf"] == pytest.approx(auc_etcu(raw, y) - auc_etcu(rf, y))
    assert "gain_auc_etcu_vs_raw" not in terms


def test_a_row_scored_on_other_labels_gets_no_gain():
    from mice_exp.report.paper_terms import long_predictions, paper_terms

    table = pd.DataFrame({"table": "table1", "dataset": "ste", "llm": "x", "row": ["Raw", "MICE RF"],
                          "estimator": ["raw", "mice_rf"], "protocol": "holdout", "features": "bertscore",
                          "run_id": ["r1", "r2"]})
    runs = {"r1": predictions(0, ["raw"]), "r2": predictions(1, ["mice_rf"])}
    terms = paper_terms(long_predictions(table, runs.get), n_resamples=50).set_index("estimator")
    assert np.isnan(terms.loc["mice_rf", "gain_auc_etcu_vs_raw"]) and terms.loc["raw", "gain_auc_etcu_vs_raw"] == 0


def test_the_papers_implied_accuracy_follows_from_raw_confidences_low_risk_utility():
    from mice_exp.metrics import LOW, etcu
    from mice_exp.report.paper_terms import implied_accuracy, paper_gains

    y = np.array([1] * 42 + [0] * 58)
    assert implied_accuracy(etcu(np.ones(100), y, LOW)) == pytest.approx(0.42)  # executing every call
    gains = paper_gains().set_index(["llm", "estimator"])
    assert gains.loc[("Llama3-8B-Instruct", "mice_rf"), "implied_accuracy"] == pytest.approx(0.4159)
    assert gains.loc[("Llama3-8B-Instruct", "mice_rf"), "gain_auc_etcu_vs_raw"] == pytest.approx(0.143)
    assert gains.loc[("Llama3.2-3B-Instruct", "mice_lr"), "gain_smece_vs_nwkr"] == pytest.approx(0.002)
