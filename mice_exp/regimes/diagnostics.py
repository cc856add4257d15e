"""Regime diagnostics: where the field says over/underconfident, how bad calibration is there,
and whether confidence-only recalibrators (isotonic, temperature) fix it (paper Fig. 4-6)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from mice_exp.estimators import IsotonicCalibration, TemperatureScaling
from mice_exp.metrics.calibration import brier, smece
from mice_exp.regimes.data import Triples
from mice_exp.regimes.field import MiscalibrationField
from mice_exp.report.figures import reliability_diagram

#: Signed regions of the field; "good" is the near-calibrated rest, |delta_hat| <= eps.
REGIONS = ("all", "over", "under", "good")


def regions(delta: np.ndarray, eps: float = 0.05) -> dict[str, np.ndarray]:
    """Boolean masks: overconfident {delta < -eps}, underconfident {delta > eps}, and the rest."""
    return {
        "all": np.ones(len(delta), dtype=bool),
        "over": delta < -eps,
        "under": delta > eps,
        "good": np.abs(delta) <= eps,
    }


def regime_metrics(
    delta: np.ndarray,
    y: np.ndarray,
    predictions: Mapping[str, np.ndarray],
    eps: float = 0.05,
    min_region: int = 30,
) -> dict[str, float]:
    """Flat, MLflow-loggable floats for one held-out split.

    ``predictions`` maps a method name to confidences on the same points and must contain
    "base" (the raw f); the regions come from ``delta``. Keys: ``field_mean``, ``field_std``,
    ``frac_<region>``, ``smece_<region>_<method>``, ``brier_<region>_<method>`` (NaN for a region
    with fewer than ``min_region`` points, where smECE is mostly noise), ``worst_slice_gap`` (the
    larger base smECE of the over/under regions minus the global one; 0 when neither region is
    populated, i.e. nothing hidden was found) and ``worst_slice_frac``.
    """
    metrics = {"field_mean": float(np.mean(delta)), "field_std": float(np.std(delta))}
    for region, mask in regions(delta, eps).items():
        metrics[f"frac_{region}"] = float(mask.mean())
        populated = mask.sum() >= min_region
        for method, p in predictions.items():
            metrics[f"smece_{region}_{method}"] = smece(p[mask], y[mask]) if populated else float("nan")
            metrics[f"brier_{region}_{method}"] = brier(p[mask], y[mask]) if populated else float("nan")
    slices = [r for r in ("over", "under") if not np.isnan(metrics[f"smece_{r}_base"])]
    worst = max(slices, key=lambda r: metrics[f"smece_{r}_base"], default=None)
    metrics["worst_slice_gap"] = metrics[f"smece_{worst}_base"] - metrics["smece_all_base"] if worst else 0.0
    metrics["worst_slice_frac"] = metrics[f"frac_{worst}"] if worst else 0.0
    return metrics


@dataclass(frozen=True)
class Diagnosis:
    metrics: dict[str, float]
    figures: dict[str, Figure]


def diagnose(
    model: MiscalibrationField,
    train: Triples,
    test: Triples,
    eps: float = 0.05,
    min_region: int = 30,
    figures: bool = True,
    figures_dir: str | Path | None = None,
) -> Diagnosis:
    """Field regions on ``test`` scored for the raw f, isotonic and temperature scaling (both fit
    on ``train``, as in appendix D.6) and the local correction; one reliability diagram of the raw
    f per populated region, saved as ``reliability_<region>.png`` when ``figures_dir`` is given."""
    delta = model.field(test.x)
    predictions = {
        "base": test.f,
        "iso": _recalibrate(IsotonicCalibration(), train, test),
        "ts": _recalibrate(TemperatureScaling(), train, test),
        "field": model.correct(test.x, test.f),
    }
    metrics = regime_metrics(delta, test.y, predictions, eps, min_region)
    drawn = {}
    if figures:
        for region, mask in regions(delta, eps).items():
            if mask.sum() >= min_region:
                title = f"{region} (n={mask.sum()}, {mask.mean():.0%} of test)"
                drawn[region] = reliability_diagram(test.f[mask], test.y[mask].astype(int), title, num_bootstrap=100)
    if figures_dir is not None:
        Path(figures_dir).mkdir(parents=True, exist_ok=True)
        for region, fig in drawn.items():
            fig.savefig(Path(figures_dir) / f"reliability_{region}.png", dpi=120)
    return Diagnosis(metrics, drawn)


def _recalibrate(calibrator: IsotonicCalibration | TemperatureScaling, train: Triples, test: Triples) -> np.ndarray:
    fitted = calibrator.fit(train.f[:, None], train.y.astype(int))
    return fitted.predict_proba(test.f[:, None])[:, 1]
