"""The paper's tables from collected runs: MICE Table 1 (main results) and Table 2 (feature ablation).

Pure pandas on :class:`~mice_exp.report.collect.RunRecord` lists; no MLflow here.

Both tables come out as one long DataFrame (one row per table row) with, per metric ``m`` of
:data:`METRICS` (the registry's Table 1 metrics, :mod:`mice_exp.metrics.registry`), the value ``m``,
its significance marks ``m_mark`` and its style ``m_style`` (``bold``: best in its block and column,
``underline``: second best, ``""``). Ranking follows the paper: it is dense and done on the values as
printed (3 decimals), so rows that print the same value share the style (Table 1 bolds five 0.356 and
underlines the 0.351 below them), each metric in its registered direction (smECE lower, every utility higher).

Marks follow Table 1: ``*`` significantly better than HRE, ``†`` than NWKR. A run logs
p-values ``pvalue_<m>_vs_<ref>`` against the reference rows it trained itself (always in-domain,
holdout, even in a leave-one-API-out run), whatever the direction of the difference; a mark
needs p < 0.05 *and* the run's value better than its ``baseline.<ref>.<m>`` and than the
reference row the table displays.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from mice_exp.compose import estimator_names as conf_names
from mice_exp.metrics import registry
from mice_exp.metrics.permutation import ALPHA
from mice_exp.metrics.registry import metric
from mice_exp.report.arguments import DEFAULT_FEATURES
from mice_exp.report.collect import RunRecord
from mice_exp.tracking.schema import MARKS, baseline_key, pvalue_key

#: The columns of Tables 1 and 2, in the paper's order.
METRICS = registry.table_metrics(registry.TABLE1)
DECIMALS = 3

#: Row order inside a block: untrained confidences and reference calibrators first, MICE models
#: last (as in Table 1).
ESTIMATOR_ORDER = ("raw", "p_true", "verbalized", "consistency", "semantic_entropy", "hre", "nwkr", "platt", "isotonic", "temperature")
MICE_ORDER = ("mice_lr", "mice_rf")
#: Table 2: RF before LR, and the ablated feature sets before the full one.
ABLATION_ESTIMATOR_ORDER = ("mice_rf", "mice_lr")
FEATURE_LABELS = {"conf_only": "Confidence Only", "first_half": "First Half Layers + Confidence",
                  "second_half": "Second Half Layers + Confidence", "all_layers": "All Layers"}
ZEROSHOT = "Zeroshot"
#: Protocols with a row in Table 1 (others, e.g. sample_efficiency, have their own results).
TABLE1_PROTOCOLS = ("holdout", "loao")

TABLE1, ABLATION = "table1", "ablation"
ID_COLUMNS = ("table", "dataset", "llm", "llm_display", "row", "estimator", "protocol", "features",
              "source", "run_id")
#: The p-value behind each mark (``<metric>_p_<ref>``: the run's permutation test against its own reference
#: row, drawn until it lies on one side of alpha with 99.9% confidence, so the mark does not depend on the draw).
PVALUE_COLUMNS = tuple(f"{m}_p_{ref}" for m in METRICS for ref in MARKS)
COLUMNS = (*ID_COLUMNS, *METRICS, *(f"{m}_mark" for m in METRICS), *(f"{m}_style" for m in METRICS), *PVALUE_COLUMNS)

CAPTION_TABLE1 = (
    "Lower smECE is better, while higher tool-calling utility is better. **Bold**: best, "
    "<u>underline</u>: second best in each column for each model. \\* / †: significantly better "
    f"than HRE / NWKR (paired permutation test of the same run, p < {ALPHA}). "
    "Zeroshot: trained leaving the test example's API out (leave-one-API-out)."
)
CAPTION_ABLATION = (
    "Feature ablation. Lower smECE is better, while higher tool-calling utility is better. "
    "**Bold**: best, <u>underline</u>: second best in each column for each model and MICE estimator."
)


# --------------------------------------------------------------------------- helpers


def is_mice(key: str) -> bool:
    return key.startswith("mice")


def _finite(value: float | None) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def fmt(value: float | None, decimals: int = DECIMALS) -> str:
    """A value as printed in the tables (``-0.000`` prints as ``0.000``)."""
    if not _finite(value):
        return "–"
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def rank_styles(values: Sequence[float | None], lower_is_better: bool, decimals: int = DECIMALS) -> list[str]:
    """``bold`` for the best printed value, ``underline`` for the second best, ``""`` otherwise."""
    printed = [float(fmt(v, decimals)) if _finite(v) else None for v in values]
    distinct = sorted({v for v in printed if v is not None}, reverse=not lower_is_better)
    styles = {v: s for v, s in zip(distinct, ("bold", "underline"))}
    return [styles.get(v, "") if v is not None else "" for v in printed]


def significance_marks(metrics: Mapping[str, float], name: str,
                       displayed: Mapping[str, float] | None = None) -> str:
    """``*`` / ``†`` for a run better than HRE / NWKR with p < 0.05 (see module docstring).

    ``displayed``: the metrics of the run whose reference rows the table shows; a mark also needs
    the run to beat those displayed values, so no mark ever sits next to a better baseline.
    """
    out = ""
    column, value = metric(name), metrics.get(name)
    for ref, mark in MARKS.items():
        p = metrics.get(pvalue_key(name, ref))
        reference = metrics.get(baseline_key(ref, name))
        shown = (displayed or metrics).get(baseline_key(ref, name), reference)
        if _finite(shown) and _finite(value) and not column.better(value, shown):
            continue
        if _finite(p) and _finite(value) and _finite(reference) and p < ALPHA and column.better(value, reference):
            out += mark
    return out


def estimator_names(records: Iterable[RunRecord]) -> dict[str, str]:
    """Display names by estimator key: each ``conf/estimator`` entry's ``name``, and the runs' own
    ``estimator.name`` params where they differ (a run of an estimator file outside ``conf/``)."""
    names = dict(conf_names())
    for record in records:
        names[record.estimator] = record.estimator_name
    return names


def _estimator_rank(key: str) -> tuple[int, str]:
    if key in ESTIMATOR_ORDER:
        return (ESTIMATOR_ORDER.index(key), "")
    if key in MICE_ORDER:
        return (100 + MICE_ORDER.index(key), "")
    return (200 if is_mice(key) else 50, key)


def _row_rank(protocol: str, key: str) -> tuple:
    """Reference calibrators, then zero-shot (leave-one-API-out) rows, then holdout MICE models."""
    group = 1 if protocol == "loao" else (2 if is_mice(key) else 0)
    return (group, _estimator_rank(key))


def _by_block(records: Iterable[RunRecord]) -> dict[tuple[str, str], list[RunRecord]]:
    blocks: dict[tuple[str, str], list[RunRecord]] = {}
    for record in records:
        blocks.setdefault((record.dataset, record.llm), []).append(record)
    return blocks


def main_features(records: Sequence[RunRecord], preferred: str | None = None) -> str:
    """The features of one LLM's main table: ``preferred`` (default bertscore) when it has runs,
    else the features with the most runs (ties: alphabetical)."""
    counts: dict[str, int] = {}
    for record in records:
        counts[record.features] = counts.get(record.features, 0) + 1
    for wanted in (preferred, DEFAULT_FEATURES):
        if wanted and wanted in counts:
            return wanted
    return sorted(counts, key=lambda f: (-counts[f], f))[0]


def _row(table: str, record: RunRecord, row: str, estimator: str, protocol: str, source: str,
         values: Mapping[str, float], marks: Mapping[str, str]) -> dict:
    out = {"table": table, "dataset": record.dataset, "llm": record.llm, "llm_display": record.llm_display,
           "row": row, "estimator": estimator, "protocol": protocol, "features": record.features,
           "source": source, "run_id": record.run_id}
    for m in METRICS:
        value = values.get(m)
        out[m] = float(value) if _finite(value) else math.nan
        out[f"{m}_mark"] = marks.get(m, "")
        for ref in MARKS:
            p = record.metrics.get(pvalue_key(m, ref)) if source == "run" else None
            out[f"{m}_p_{ref}"] = float(p) if _finite(p) else math.nan
    return out


def add_styles(frame: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Fill the ``<metric>_style`` columns, ranking within each group of ``by``."""
    frame = frame.copy()
    for m in METRICS:
        frame[f"{m}_style"] = ""
    if frame.empty:
        return frame
    for _, index in frame.groupby(list(by), sort=False).groups.items():
        for m in METRICS:
            lower_is_better = not metric(m).higher_is_better
            frame.loc[index, f"{m}_style"] = rank_styles(frame.loc[index, m].tolist(), lower_is_better)
    return frame


def _sort_blocks(frame: pd.DataFrame) -> pd.DataFrame:
    """Blocks by dataset then by the LLM's display name; rows keep their order inside a block."""
    if frame.empty:
        return frame
    frame = frame.assign(_order=range(len(frame)))
    frame = frame.sort_values(["dataset", "llm_display", "llm", "_order"], kind="stable")
    return frame.drop(columns="_order").reset_index(drop=True)


# --------------------------------------------------------------------------- Table 1


def baseline_source(records: Sequence[RunRecord], features: str) -> RunRecord | None:
    """The run whose reference rows fill the table: the latest holdout run with the table's
    features that logged some (else the latest holdout run with any features that did)."""
    def candidates(same_features: bool) -> list[RunRecord]:
        return [r for r in records if r.protocol == "holdout" and r.baseline_keys()
                and (r.features == features or not same_features)]

    for same in (True, False):
        found = candidates(same)
        if found:
            return max(found, key=lambda r: (r.start_time, r.run_id))
    return None


def table1_block(records: Sequence[RunRecord], features: str | None = None,
                 names: Mapping[str, str] | None = None) -> list[dict]:
    """Rows of one (dataset, LLM) block of Table 1."""
    names = names or estimator_names(records)
    records = [r for r in records if r.protocol in TABLE1_PROTOCOLS]
    if not records:
        return []
    features = main_features(records, features)
    rows: list[tuple[tuple, dict]] = []
    present: set[tuple[str, str]] = set()
    source = baseline_source(records, features)
    if source is not None:
        for key in source.baseline_keys():
            values = {m: source.metrics.get(baseline_key(key, m)) for m in METRICS}
            rows.append((_row_rank("holdout", key),
                         _row(TABLE1, source, names.get(key, key), key, "holdout", "baseline", values, {})))
            present.add((key, "holdout"))
    for record in sorted(records, key=lambda r: _row_rank(r.protocol, r.estimator)):
        if (record.features != features or record.protocol not in TABLE1_PROTOCOLS
                or (record.estimator, record.protocol) in present):
            continue
        name = names.get(record.estimator, record.estimator)
        label = f"{name} {ZEROSHOT}" if record.protocol == "loao" else name
        marks = {m: significance_marks(record.metrics, m, source.metrics if source else None) for m in METRICS}
        rows.append((_row_rank(record.protocol, record.estimator),
                     _row(TABLE1, record, label, record.estimator, record.protocol, "run", record.metrics, marks)))
        present.add((record.estimator, record.protocol))
    return [row for _, row in sorted(rows, key=lambda item: item[0])]


def table1(records: Sequence[RunRecord], features: str | None = None) -> pd.DataFrame:
    """MICE Table 1 for every (dataset, LLM): reference rows from a holdout run's baselines,
    "<name> Zeroshot" rows from leave-one-API-out runs, holdout rows of the other estimators."""
    names = estimator_names(records)
    rows = [row for block in _by_block(records).values() for row in table1_block(block, features, names)]
    frame = pd.DataFrame(rows, columns=[c for c in COLUMNS if not c.endswith("_style")])
    return _sort_blocks(add_styles(frame, ["dataset", "llm"]))[list(COLUMNS)]


# --------------------------------------------------------------------------- Table 2


def short_name(name: str) -> str:
    """``MICE RF`` -> ``RF`` (Table 2's "MICE Model" column)."""
    return name[5:] if name.startswith("MICE ") else name


def _feature_rank(features: str, main: str) -> tuple:
    if features == main:
        return (2, "")
    if features in FEATURE_LABELS:
        return (0, list(FEATURE_LABELS).index(features))
    return (1, features)


def ablation_table(records: Sequence[RunRecord], features: str | None = None) -> pd.DataFrame:
    """MICE Table 2: one row per feature set for each MICE estimator with holdout runs on two or
    more feature sets; the table's main features come last, labelled by the estimator alone."""
    names = estimator_names(records)
    rows: list[dict] = []
    for block in _by_block(records).values():
        main = main_features(block, features)
        by_estimator: dict[str, list[RunRecord]] = {}
        for record in block:
            if record.protocol == "holdout" and is_mice(record.estimator):
                by_estimator.setdefault(record.estimator, []).append(record)
        order = sorted(by_estimator, key=lambda k: (ABLATION_ESTIMATOR_ORDER.index(k)
                                                   if k in ABLATION_ESTIMATOR_ORDER else 99, k))
        for key in order:
            runs = by_estimator[key]
            if len({r.features for r in runs}) < 2:
                continue
            short = short_name(names.get(key, key))
            for record in sorted(runs, key=lambda r: _feature_rank(r.features, main)):
                label = short if record.features == main else \
                    f"{short} {FEATURE_LABELS.get(record.features, record.features)}"
                rows.append(_row(ABLATION, record, label, key, "holdout", "run", record.metrics, {}))
    frame = pd.DataFrame(rows, columns=[c for c in COLUMNS if not c.endswith("_style")])
    return _sort_blocks(add_styles(frame, ["dataset", "llm", "estimator"]))[list(COLUMNS)]


# --------------------------------------------------------------------------- rendering


def cell(value: float, style: str, mark: str = "") -> str:
    """One Markdown cell: ``**0.144** \\*†``, ``<u>0.051</u> †``, ``0.033``."""
    text = fmt(value)
    if style == "bold":
        text = f"**{text}**"
    elif style == "underline":
        text = f"<u>{text}</u>"
    if mark:
        text += " " + mark.replace("*", "\\*")
    return text


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def to_markdown(frame: pd.DataFrame, row_header: str, block_header: str = "Model", marks: bool = True) -> str:
    """A table in the paper's layout: the model's name on the first row of its block."""
    head = [block_header, row_header, *(metric(m).header for m in METRICS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":---", ":---"] + ["---:"] * len(METRICS)) + "|"]
    previous = None
    for row in frame.itertuples(index=False):
        block = (row.dataset, row.llm)
        model = _escape(row.llm_display) if block != previous else ""
        previous = block
        cells = [cell(getattr(row, m), getattr(row, f"{m}_style"), getattr(row, f"{m}_mark") if marks else "")
                 for m in METRICS]
        lines.append("| " + " | ".join([model, _escape(row.row), *cells]) + " |")
    return "\n".join(lines)


def results_csv(*frames: pd.DataFrame) -> pd.DataFrame:
    """Both tables stacked (column ``table`` tells them apart), in :data:`COLUMNS` order, then the
    bootstrap intervals ``<metric>_lo`` / ``<metric>_hi`` where the report computed them."""
    kept = [f for f in frames if not f.empty]
    if not kept:
        return pd.DataFrame(columns=list(COLUMNS))
    stacked = pd.concat(kept, ignore_index=True)
    intervals = [f"{m}_{end}" for m in METRICS for end in ("lo", "hi") if f"{m}_{end}" in stacked]
    return stacked[[*COLUMNS, *intervals]]


def markdown_sections(table: pd.DataFrame, ablation: pd.DataFrame) -> list[str]:
    """Markdown sections (one Table 1 and one Table 2 per dataset), captions included."""
    sections = []
    for dataset, block in table.groupby("dataset", sort=True):
        features = ", ".join(f"`{f}`" for f in dict.fromkeys(block["features"][block["source"] == "run"]))
        title = f"## Table 1: results on the test set ({dataset}"
        title += f"; features {features})" if features else ")"
        sections.append("\n\n".join([title, to_markdown(block, "Confidence Estimator"), CAPTION_TABLE1]))
    for dataset, block in ablation.groupby("dataset", sort=True):
        sections.append("\n\n".join([f"## Table 2: feature ablation ({dataset})",
                                     to_markdown(block, "MICE Model", "Base LLM", marks=False),
                                     CAPTION_ABLATION]))
    return sections
