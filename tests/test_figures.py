"""Report figures render to PNG and draw what they claim (line, bar and box counts, styles)."""

from __future__ import annotations

import io

import matplotlib as mpl
import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

from mice_exp.report.figures import (
    BAR_COLOR,
    HIGHLIGHT_COLOR,
    etcu_curves,
    feature_weights,
    layer_score_distributions,
    reliability_diagram,
    risk_coverage_curves,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def count_boxes(fig: Figure) -> dict[str, int]:
    """Boxes per group in a layer_score_distributions figure (each box carries the gid ``box:<group>``)."""
    counts: dict[str, int] = {}
    for patch in fig.axes[0].patches:
        gid = patch.get_gid() or ""
        if gid.startswith("box:"):
            counts[gid[4:]] = counts.get(gid[4:], 0) + 1
    return counts


def png_bytes(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=60)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    y = (rng.random(300) < 0.4).astype(int)
    p = np.clip(0.25 + 0.5 * y + 0.2 * rng.normal(size=300), 0.0, 1.0)
    return p, y


def test_reliability_diagram_renders_relplots_curve_and_smece(data):
    import relplot

    p, y = data
    before_rng, before_font = np.random.get_state()[1].copy(), mpl.rcParams["font.size"]
    fig = reliability_diagram(p, y, "MICE RF", num_bootstrap=20)
    assert isinstance(fig, Figure)
    assert png_bytes(fig).startswith(PNG_MAGIC)
    ax = fig.axes[0]
    assert ax.get_title() == "MICE RF"
    assert any(isinstance(c, PathCollection) for c in ax.collections)  # relplot's density-weighted curve
    texts = [t.get_text() for t in ax.texts]
    assert any(f"{relplot.smECE(p, y):.3f}" in t for t in texts), texts
    # neither numpy's global RNG nor matplotlib's global style is changed by drawing
    assert np.array_equal(np.random.get_state()[1], before_rng)
    assert mpl.rcParams["font.size"] == before_font


def test_reliability_diagram_is_reproducible_and_validates(data):
    p, y = data
    a = reliability_diagram(p, y, "", num_bootstrap=10, seed=3)
    b = reliability_diagram(p, y, "", num_bootstrap=10, seed=3)
    assert png_bytes(a) == png_bytes(b)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        reliability_diagram(p * 2, y, "")
    with pytest.raises(ValueError, match="entries"):
        reliability_diagram(p, y[:-1], "")


def _etcu(p, y, taus):
    executed = p[None, :] > taus[:, None]
    fp = taus / (taus - 1)
    return (executed * np.where(y == 1, 1.0, fp[:, None])).mean(axis=1)


def test_etcu_curves_draw_estimators_solid_and_policies_dashed(data):
    p, y = data
    taus = np.arange(1, 1000) / 1000
    curves = {"raw": _etcu(np.full_like(p, 0.9), y, taus), "mice_rf": _etcu(p, y, taus)}
    policies = {
        "oracle": _etcu(y.astype(float), y, taus),
        "always_abstain": _etcu(np.zeros_like(p), y, taus),
        "always_execute": _etcu(np.ones_like(p), y, taus),
        "base_rate": _etcu(np.full_like(p, y.mean()), y, taus),
    }
    fig = etcu_curves(curves, taus, policies, title="ETCU")
    assert png_bytes(fig).startswith(PNG_MAGIC)
    ax = fig.axes[0]
    lines = {line.get_gid(): line for line in ax.get_lines()}
    assert sorted(lines) == sorted([f"curve:{k}" for k in curves] + [f"policy:{k}" for k in policies])
    assert all(lines[f"curve:{k}"].get_linestyle() == "-" for k in curves)
    assert all(lines[f"policy:{k}"].get_linestyle() not in ("-", "None") for k in policies)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "raw", "mice rf", "oracle", "always abstain", "always execute", "base rate"]
    # always_execute dives to about -600 near tau = 1; the axis stays readable around the estimators
    low, high = ax.get_ylim()
    assert policies["always_execute"].min() < -100 < low
    assert high >= policies["oracle"].max() and low <= curves["raw"].min()


def test_risk_coverage_curves_one_line_per_estimator_with_oracle_and_random_dashed(data):
    p, y = data
    fig = risk_coverage_curves({"raw": np.full_like(p, 0.9), "mice_rf": p}, y, title="risk-coverage")
    assert png_bytes(fig).startswith(PNG_MAGIC)
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    assert sorted(lines) == ["curve:mice_rf", "curve:raw", "policy:oracle", "policy:random"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[0].startswith("raw (AURC ") and labels[2:] == ["oracle", "random"]
    # The oracle's risk is 0 until every correct call is kept; at full coverage all curves meet.
    oracle = lines["policy:oracle"].get_ydata()
    assert oracle[int(y.sum()) - 1] == 0.0
    assert lines["curve:mice_rf"].get_ydata()[-1] == pytest.approx(1 - y.mean(), abs=1e-12)  # float rounding only


def test_etcu_curves_reject_a_curve_of_the_wrong_length():
    taus = np.linspace(0.1, 0.9, 9)
    with pytest.raises(ValueError, match="one per tau"):
        etcu_curves({"a": np.zeros(8)}, taus, {})


def test_feature_weights_one_bar_per_feature_confidence_highlighted():
    names = [f"layer_{i}" for i in range(1, 12)] + ["confidence"]
    values = np.r_[np.full(11, 0.02), 0.08]
    fig = feature_weights(names, values, "importance", title="MICE RF")
    assert png_bytes(fig).startswith(PNG_MAGIC)
    bars = [p for p in fig.axes[0].patches if (p.get_gid() or "").startswith("bar:")]
    assert len(bars) == len(names)
    colors = {b.get_gid()[4:]: mpl.colors.to_hex(b.get_facecolor()) for b in bars}
    assert colors["confidence"] == HIGHLIGHT_COLOR
    assert {colors[n] for n in names[:-1]} == {BAR_COLOR}
    assert [round(b.get_height(), 6) for b in bars] == [round(v, 6) for v in values]


def test_feature_weights_coefficients_can_be_negative_and_kind_is_checked():
    fig = feature_weights(["a", "raw_confidence", "b"], [-1.0, 2.0, 0.5], "lr", highlight="a")
    bars = [p for p in fig.axes[0].patches if (p.get_gid() or "").startswith("bar:")]
    assert bars[0].get_height() == -1.0
    assert mpl.colors.to_hex(bars[0].get_facecolor()) == HIGHLIGHT_COLOR  # explicit highlight wins
    assert mpl.colors.to_hex(bars[1].get_facecolor()) == BAR_COLOR
    with pytest.raises(ValueError, match="kind"):
        feature_weights(["a"], [1.0], "gini")
    with pytest.raises(ValueError, match="values for"):
        feature_weights(["a", "b"], [1.0], "importance")


def test_layer_score_boxes_split_by_label(data):
    _, y = data
    rng = np.random.default_rng(1)
    layers = [2, 4, 6, 8, 10]
    scores = np.clip(0.7 + 0.05 * np.arange(5)[None, :] + 0.03 * rng.normal(size=(y.size, 5)), 0, 1)
    fig = layer_score_distributions(scores, y, layers, title="Figure 8")
    assert png_bytes(fig).startswith(PNG_MAGIC)
    assert count_boxes(fig) == {"correct": 5, "incorrect": 5}
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [str(n) for n in layers]
    assert count_boxes(layer_score_distributions(scores, None, layers)) == {"all examples": 5}

    scores[y == 0, 2] = np.nan  # no incorrect example has a score at layer 6: that box is left out
    assert count_boxes(layer_score_distributions(scores, y, layers)) == {"correct": 5, "incorrect": 4}
    with pytest.raises(ValueError, match="layer numbers"):
        layer_score_distributions(scores, y, layers[:-1])


def test_figures_are_not_registered_with_pyplot(data):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    p, y = data
    etcu_curves({"a": p[:10]}, np.linspace(0.05, 0.95, 10))
    feature_weights(["confidence"], [1.0])
    assert plt.get_fignums() == before
