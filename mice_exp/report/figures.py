"""Figures of the MICE paper (Figures 3-6, 8) and the smooth reliability diagram.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot: nothing is
registered in pyplot's global figure list (so nothing leaks across a sweep's jobs), no GUI
backend is needed (saving a PNG renders with Agg), and matplotlib's global style is left
untouched (relplot's own ``set_default_style`` would rewrite rcParams, so it is not used).
Save with ``fig.savefig(path)`` or ``run.log_figure(fig, "figures/name.png")``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

from mice_exp.metrics import aurc, risk_coverage_curve, smece, smece_rows
from mice_exp.metrics.bootstrap import bootstrap_intervals

#: Colours of Figure 8 (seaborn's default palette): correct in blue, incorrect in orange.
CORRECT_COLOR = "#1f77b4"
INCORRECT_COLOR = "#ff7f0e"
HIGHLIGHT_COLOR = "#d62728"
BAR_COLOR = "#8c8c8c"

#: Trivial policies of MICE Figure 4, drawn dashed in greys/black so estimators stand out.
POLICY_STYLES: dict[str, dict[str, object]] = {
    "oracle": {"color": "black", "linestyle": "--"},
    "always_abstain": {"color": "0.55", "linestyle": (0, (2, 2))},
    "always_execute": {"color": "0.35", "linestyle": (0, (6, 2))},
    "base_rate": {"color": "0.2", "linestyle": (0, (6, 2, 1, 2))},
}


def _labels(y: ArrayLike, n: int, name: str = "labels") -> np.ndarray:
    y = np.asarray(y).reshape(-1)
    if y.size != n:
        raise ValueError(f"{name} has {y.size} entries; expected {n}")
    if not np.isin(y, (0, 1)).all():
        raise ValueError(f"{name} must be 0/1 (or booleans)")
    return y.astype(int)


def _pretty(name: str) -> str:
    return name.replace("_", " ")


# --------------------------------------------------------------------------- reliability


def reliability_diagram(
    p: ArrayLike,
    y: ArrayLike,
    title: str = "",
    *,
    confidence_band: bool = True,
    num_bootstrap: int = 200,
    seed: int = 0,
) -> Figure:
    """relplot's smooth reliability diagram (Blasiok & Nakkiran) with its smECE.

    The red curve is the kernel-smoothed E[y | p], drawn thicker where predictions are dense;
    the grey band is a bootstrap 95% band; ticks on the x axis are a sample of predictions
    (above the axis: correct, below: incorrect); "+-" after the smECE is half the width of its 95%
    bootstrap interval (100 resamples). Bootstrapping is seeded so the same inputs draw the same figure.
    """
    import relplot

    p = np.asarray(p, dtype=float).reshape(-1)
    y = _labels(y, p.size, "y")
    if p.size == 0:
        raise ValueError("reliability_diagram needs at least one prediction")
    if np.any((p < 0) | (p > 1)) or not np.isfinite(p).all():
        raise ValueError("p must hold confidences in [0, 1]")

    # relplot's bagging and bootstrap draw from numpy's global RNG: seed it, then put it back.
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        diagram = relplot.prepare_rel_diagram(
            p,
            y,
            plot_confidence_band=confidence_band,
            report_CE_std=False,
            num_bootstrap=num_bootstrap,
        )
    finally:
        np.random.set_state(state)
    if confidence_band:  # relplot's own "+-" (scipy's basic bootstrap, 100 smECEs one at a time: ~2 s)
        low, high = bootstrap_intervals(p, y, {"smece": smece}, n_resamples=100, seed=seed,
                                        rows_metrics={"smece": smece_rows})["smece"]
        diagram["ce_ci_width"] = max(high - diagram["ce"], diagram["ce"] - low)

    fig = Figure(figsize=(5.5, 5.5), layout="constrained")
    ax = fig.add_subplot()
    relplot.plot_rel_diagram(diagram, fig=fig, ax=ax, use_default_style=False)
    ax.set_xlabel("confidence p")
    ax.set_ylabel("E[correct | p]")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return fig


def region_reliability(p: ArrayLike, y: ArrayLike, regions: Mapping[str, np.ndarray],
                       num_bootstrap: int = 100) -> dict[str, Figure]:
    """One reliability diagram of ``p`` per miscalibration region (a boolean mask over the rows),
    titled with its size: where a global diagram averages opposite errors away (regimes, Fig. 5)."""
    p, y = np.asarray(p, dtype=float), np.asarray(y).astype(int)
    return {region: reliability_diagram(p[mask], y[mask], f"{region} (n={mask.sum()}, {mask.mean():.0%} of test)",
                                        num_bootstrap=num_bootstrap)
            for region, mask in regions.items()}


# --------------------------------------------------------------------------- ETCU (Figure 4)


def etcu_curves(
    curves: Mapping[str, ArrayLike],
    taus: ArrayLike,
    policies: Mapping[str, ArrayLike] | None = None,
    *,
    title: str = "",
    ylim: tuple[float, float] | None = None,
) -> Figure:
    """Expected tool-calling utility against the risk level tau (MICE Figure 4).

    ``curves`` maps estimator names to ETCU values at ``taus`` (solid lines); ``policies`` maps
    the trivial policies (oracle, always_abstain, always_execute, base_rate, ...) to theirs
    (dashed). ``always_execute`` falls towards minus infinity as tau -> 1, so unless ``ylim`` is
    given the y axis is cut at minus the best utility reached, or lower where an estimator goes.
    """
    taus = np.asarray(taus, dtype=float).reshape(-1)
    policies = policies or {}
    if not curves and not policies:
        raise ValueError("etcu_curves needs at least one curve")
    series = {k: np.asarray(v, dtype=float).reshape(-1) for k, v in curves.items()}
    lines = {k: np.asarray(v, dtype=float).reshape(-1) for k, v in policies.items()}
    for name, values in {**series, **lines}.items():
        if values.shape != taus.shape:
            raise ValueError(f"curve {name!r} has {values.size} values; expected one per tau ({taus.size})")

    fig = Figure(figsize=(8.0, 4.5), layout="constrained")
    ax = fig.add_subplot()
    palette = [f"C{i}" for i in range(10)]
    for i, (name, values) in enumerate(series.items()):
        ax.plot(taus, values, color=palette[i % 10], linewidth=1.8, label=_pretty(name), gid=f"curve:{name}", zorder=3)
    for name, values in lines.items():  # under the estimators, which they often coincide with
        style = POLICY_STYLES.get(name, {"color": "0.4", "linestyle": "--"})
        ax.plot(taus, values, linewidth=1.2, label=_pretty(name), gid=f"policy:{name}", zorder=2, **style)

    if ylim is None:
        estimator_values = np.concatenate([v for v in series.values()]) if series else np.array([0.0])
        everything = np.concatenate([estimator_values, *lines.values()]) if lines else estimator_values
        finite = everything[np.isfinite(everything)]
        top = max(float(finite.max()) if finite.size else 1.0, 0.0)
        est_finite = estimator_values[np.isfinite(estimator_values)]
        floor = min(-max(top, 0.05), float(est_finite.min()) if est_finite.size else 0.0)
        pad = 0.05 * (top - floor or 1.0)
        ylim = (floor - pad, top + pad)
    ax.set_ylim(*ylim)
    ax.set_xlim(min(0.0, float(taus.min())), max(1.0, float(taus.max())))
    ax.set_xlabel("risk level τ (execute iff confidence > τ)")
    ax.set_ylabel("expected tool-calling utility")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small", frameon=False)
    return fig


# --------------------------------------------------------------------------- selective prediction


def risk_coverage_curves(predictions: Mapping[str, ArrayLike], y: ArrayLike, *, title: str = "") -> Figure:
    """Risk (error rate of the calls kept) against coverage, keeping the most confident first.

    One solid line per estimator in ``predictions`` (labelled with its AURC, lower is better),
    the oracle (every correct call kept first) and random rejection (the base error rate) dashed.
    """
    if not predictions:
        raise ValueError("risk_coverage_curves needs at least one estimator's predictions")
    y = np.asarray(y).reshape(-1)
    fig = Figure(figsize=(8.0, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, (name, p) in enumerate(predictions.items()):
        coverage, risk = risk_coverage_curve(p, y)
        ax.plot(coverage, risk, color=f"C{i % 10}", linewidth=1.8, zorder=3, gid=f"curve:{name}",
                label=f"{_pretty(name)} (AURC {aurc(p, y):.3f})")
    coverage, oracle = risk_coverage_curve(y.astype(float), y)
    ax.plot(coverage, oracle, linewidth=1.2, label="oracle", gid="policy:oracle", zorder=2, **POLICY_STYLES["oracle"])
    ax.plot(coverage, np.full_like(coverage, 1.0 - y.mean()), linewidth=1.2, label="random", gid="policy:random",
            zorder=2, **POLICY_STYLES["base_rate"])
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("coverage (share of calls executed, most confident first)")
    ax.set_ylabel("risk (error rate of executed calls)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small", frameon=False)
    return fig


# --------------------------------------------------------------------------- weights (Figures 5, 6)

_KINDS = {
    "importance": "random-forest feature importance (Gini)",
    "rf": "random-forest feature importance (Gini)",
    "coefficient": "logistic-regression coefficient",
    "lr": "logistic-regression coefficient",
}


def feature_weights(
    names: Sequence[str],
    values: ArrayLike,
    kind: str = "importance",
    *,
    highlight: str | Sequence[str] | None = None,
    title: str = "",
) -> Figure:
    """One bar per feature, in the given order (MICE Figures 5 and 6).

    ``kind`` is ``"importance"`` (alias ``"rf"``) or ``"coefficient"`` (alias ``"lr"``).
    Features named in ``highlight`` are drawn in red; by default those whose name contains
    ``confidence`` (the raw-confidence feature the paper finds most important).
    """
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r}; expected one of {', '.join(_KINDS)}")
    names = [str(n) for n in names]
    values = np.asarray(values, dtype=float).reshape(-1)
    if values.size != len(names):
        raise ValueError(f"{values.size} values for {len(names)} feature names")
    if highlight is None:
        marked = {n for n in names if "confidence" in n.lower()}
    else:
        marked = {highlight} if isinstance(highlight, str) else set(highlight)
        unknown = marked - set(names)
        if unknown:
            raise ValueError(f"highlight names unknown features: {sorted(unknown)}")

    width = min(max(4.0, 0.28 * len(names) + 1.5), 16.0)
    fig = Figure(figsize=(width, 4.2), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(names))
    colors = [HIGHLIGHT_COLOR if n in marked else BAR_COLOR for n in names]
    bars = ax.bar(x, values, color=colors, edgecolor="none")
    for bar, name in zip(bars, names):
        bar.set_gid(f"bar:{name}")
    ax.set_xticks(x, [_pretty(n) for n in names], rotation=90 if len(names) > 8 else 0, fontsize="small")
    for tick, name in zip(ax.get_xticklabels(), names):
        if name in marked:
            tick.set_color(HIGHLIGHT_COLOR)
            tick.set_fontweight("bold")
    if kind in ("coefficient", "lr"):
        ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylabel(_KINDS[kind])
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


# --------------------------------------------------------------------------- BERTScores (Figures 3, 8)


def layer_score_distributions(
    scores: ArrayLike,
    labels: ArrayLike | None,
    layer_numbers: Sequence[int],
    *,
    title: str = "",
    ylabel: str = "BERTScore with the final output",
) -> Figure:
    """Box plots of per-layer scores (MICE Figure 3), split by correct / incorrect (Figure 8).

    ``scores`` is ``[n_examples, n_layers]``; column ``j`` belongs to layer ``layer_numbers[j]``.
    With ``labels`` (0/1 per example) each layer gets a blue box for correct and an orange one
    for incorrect examples; with ``labels=None`` one box per layer. Boxes follow seaborn's
    defaults as in the paper: whiskers at 1.5 IQR, outliers as points. NaN scores are dropped;
    a group with no scores at a layer draws no box.
    """
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2:
        raise ValueError(f"scores must be [n_examples, n_layers]; got shape {scores.shape}")
    layer_numbers = [int(n) for n in layer_numbers]
    if scores.shape[1] != len(layer_numbers):
        raise ValueError(f"scores has {scores.shape[1]} layer columns for {len(layer_numbers)} layer numbers")

    if labels is None:
        groups = [("all examples", np.ones(scores.shape[0], dtype=bool), CORRECT_COLOR)]
    else:
        y = _labels(labels, scores.shape[0])
        groups = [("correct", y == 1, CORRECT_COLOR), ("incorrect", y == 0, INCORRECT_COLOR)]

    n_layers = len(layer_numbers)
    width = float(np.clip(0.2 * n_layers * len(groups) + 2.0, 5.0, 15.0))
    fig = Figure(figsize=(width, 4.5), layout="constrained")
    ax = fig.add_subplot()
    box_width = 0.8 / len(groups)
    handles = []
    for g, (name, mask, color) in enumerate(groups):
        offset = (g - (len(groups) - 1) / 2) * box_width
        data, positions = [], []
        for j in range(n_layers):
            column = scores[mask, j]
            column = column[np.isfinite(column)]
            if column.size:
                data.append(column)
                positions.append(j + offset)
        if not data:
            continue
        parts = ax.boxplot(
            data,
            positions=positions,
            widths=box_width * 0.85,
            patch_artist=True,
            manage_ticks=False,
            flierprops={"marker": "o", "markersize": 2.5, "markerfacecolor": color, "markeredgecolor": "none", "alpha": 0.6},
            medianprops={"color": "0.15", "linewidth": 1.2},
            whiskerprops={"color": "0.3"},
            capprops={"color": "0.3"},
        )
        for box in parts["boxes"]:
            box.set_facecolor(color)
            box.set_edgecolor("0.3")
            box.set_alpha(0.85)
            box.set_gid(f"box:{name}")
        handles.append((parts["boxes"][0], f"{name} (n={int(mask.sum())})"))

    ax.set_xticks(np.arange(n_layers), [str(n) for n in layer_numbers], fontsize="small")
    ax.set_xlim(-0.6, n_layers - 0.4)
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    if len(groups) > 1 and handles:
        ax.legend([h for h, _ in handles], [t for _, t in handles], loc="upper left", fontsize="small")
    return fig

