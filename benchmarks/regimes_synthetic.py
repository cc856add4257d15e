"""The hidden-miscalibration paper's synthetic results (section 4, appendix E) over 3 seeds.

n = 10,000 points split 80/10/10, the synthetic network (h 256, L 2, d_out 64) and appendix D's
training settings. Every (sigma, lambda) grid point is fitted on its own (the estimator seeds
every grid point alike, so this is the grid search of ``MiscalibrationField.fit`` with each
point's test correlation kept), which gives in one pass:

* Figure 2 / appendix E.2: three clusters, test correlation of the proxy-selected field;
* Figure 9b: sinusoid recovery over amplitude A x frequency k (proxy-selected);
* Figure 10: test correlation over the sigma x lambda grid at k = 3;
* Figure 3 / appendix E.5: Spearman(-proxy, oracle), oracle spread and selection regret.

Variants: ``paper`` (appendix D as written: lr 3e-5, dropout 0.1), ``no_dropout`` (the same with
dropout 0, see experiments/field/README.md for why) and ``paper_lr1e-3``. A group (one data set,
seed and variant over its grid) is appended to ``synthetic_runs.jsonl`` as soon as it finishes, so
an interrupted run resumes where it stopped; ``--report`` turns the file into
``synthetic.json``, the figures and the Markdown tables.

    nice -n 19 .venv/bin/python benchmarks/regimes_synthetic.py            # run what is missing, then report
    .venv/bin/python benchmarks/regimes_synthetic.py --report              # tables and figures only
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from mice_exp.estimators.field import regime_predictions  # noqa: E402
from mice_exp.regimes import (  # noqa: E402
    MiscalibrationField,
    SyntheticData,
    preset_config,
    regime_metrics,
    sinusoidal,
    three_clusters,
)
from mice_exp.regimes.kernel import leave_one_out  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "experiments" / "field"
SEEDS = (0, 1, 2)
VARIANTS: dict[str, dict[str, float]] = {
    "paper": {},
    "no_dropout": {"dropout": 0.0},
    "paper_lr1e-3": {"lr": 1e-3},
}
FULL_GRID = ((0.05, 0.1, 0.2, 0.3), (1e-4, 1e-3, 1e-2))
SMALL_GRID = ((0.05, 0.1, 0.2), (1e-4, 1e-2))
CLUSTER_GRID = ((0.1, 0.2, 0.3), (1e-4, 1e-2))
#: Amplitude x frequency settings of Figure 9b / E.5 that fit the CPU budget (the paper: 5 x 5).
AK_SETTINGS = ((0.2, 1), (0.2, 5), (1.0, 1), (1.0, 5), (0.6, 3))
#: Data sets whose seed-0 selected field is kept for the field maps of Figure 2.
MAPPED = ("three_clusters", "sinusoidal_A0.6_k3")


@dataclass(frozen=True)
class Group:
    """One data set, seed and variant, fitted at every point of a sigma x lambda grid."""

    dataset: str
    seed: int
    variant: str
    sigmas: tuple[float, ...]
    lambdas: tuple[float, ...]

    @property
    def key(self) -> str:
        return f"{self.dataset}|{self.seed}|{self.variant}|{self.sigmas}|{self.lambdas}"


def plan() -> list[Group]:
    """In priority order: Figure 10's grid at A = 0.6, k = 3; Figure 2's clusters; Figure 9b's corners."""
    groups = [Group("sinusoidal_A0.6_k3", s, v, *FULL_GRID) for v in ("paper", "no_dropout") for s in SEEDS]
    groups += [Group("three_clusters", s, v, *CLUSTER_GRID) for v in ("paper", "no_dropout") for s in SEEDS]
    groups += [Group(f"sinusoidal_A{a}_k{k}", s, "no_dropout", *SMALL_GRID) for a, k in AK_SETTINGS[:-1] for s in SEEDS]
    groups += [Group("sinusoidal_A0.6_k3", s, "paper_lr1e-3", (0.1, 0.2, 0.3), (1e-3,)) for s in SEEDS]
    return groups


def make_data(dataset: str, seed: int) -> SyntheticData:
    if dataset == "three_clusters":
        return three_clusters(n=10_000, seed=seed)
    amplitude, frequency = dataset.removeprefix("sinusoidal_A").split("_k")
    return sinusoidal(n=10_000, seed=seed, amplitude=float(amplitude), frequency=int(frequency))


def batch_masses(model: MiscalibrationField, data: SyntheticData) -> dict[str, float]:
    """In-batch leave-one-out mass m_i (what Eq. 4's hinge sees) at the kept checkpoint, on one
    training batch, with dropout on (as in training) and off (as at evaluation)."""
    x = model.standardiser_(data.train.x[: model.config.batch_size])
    r = torch.from_numpy((data.train.y - data.train.f)[: model.config.batch_size].astype(np.float32))
    out = {}
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for mode in ("train", "eval"):
            model.phi_.train(mode == "train")
            mass = leave_one_out(model.phi_(x), r, model.sigma_).mass
            out[f"{mode}_mass_median"] = float(mass.median())
            out[f"{mode}_mass_below_m_min"] = float((mass < model.config.m_min).float().mean())
    model.phi_.eval()
    return out


def run_group(group: Group) -> dict[str, Any]:
    data = make_data(group.dataset, group.seed)
    config = preset_config("synthetic", seed=group.seed, num_threads=1, progress=False, **VARIANTS[group.variant])
    cells, best = [], None
    for sigma, lam in itertools.product(group.sigmas, group.lambdas):
        model = MiscalibrationField(config, sigmas=(sigma,), lambdas=(lam,))
        start = time.process_time()
        model.fit(data.train.x, data.train.f, data.train.y, data.val.x, data.val.f, data.val.y)
        cpu = time.process_time() - start
        history = model.history_[0]
        cells.append({
            "sigma": sigma, "lambda": lam, "val_proxy": model.val_proxy_,
            "test_corr": float(np.corrcoef(model.field(data.test.x), data.true_field["test"])[0, 1]),
            "best_epoch": history["best_epoch"], "epochs": history["epochs"], "cpu_seconds": cpu,
            **batch_masses(model, data),
        })
        if best is None or model.val_proxy_ < best.val_proxy_:
            best = model
    delta = best.field(data.test.x)
    diagnosis = regime_metrics(delta, data.test.y, regime_predictions(best, data.train, data.test))
    truth = regime_metrics(data.true_field["test"], data.test.y, {"base": data.test.f})
    selected = {
        "sigma": best.sigma_, "lambda": best.lambda_, "alpha": best.alpha_,
        **{k: diagnosis[k] for k in diagnosis if k.startswith(("smece_", "worst_slice", "frac_"))},
        "true_regions_smece": {r: truth[f"smece_{r}_base"] for r in ("all", "over", "under")},
    }
    if group.seed == 0 and group.dataset in MAPPED:
        selected["test_field"] = [round(float(v), 4) for v in delta]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"key": group.key, "dataset": group.dataset, "seed": group.seed, "variant": group.variant,
            "cells": cells, "selected": selected, "load_average": os.getloadavg()[0], "commit": commit}


def read_runs(path: Path) -> Iterator[dict[str, Any]]:
    """The recorded groups, the first record of a key only (two runners may both finish one)."""
    seen = set()
    for line in path.read_text().splitlines() if path.exists() else ():
        run = json.loads(line)
        if run["key"] not in seen:
            seen.add(run["key"])
            yield run


# ----------------------------------------------------------------------------------- report


def on_grid(cells: list[dict[str, Any]], sigmas: tuple[float, ...], lambdas: tuple[float, ...]) -> list[dict[str, Any]]:
    return [c for c in cells if c["sigma"] in sigmas and c["lambda"] in lambdas]


def selection(cells: list[dict[str, Any]]) -> dict[str, float]:
    """Proxy selection on a grid against the oracle (appendix E.5); ties in the proxy keep grid order."""
    proxy = np.array([c["val_proxy"] for c in cells])
    oracle = np.array([c["test_corr"] for c in cells])
    chosen = int(np.argmin(proxy))
    rho = spearmanr(-proxy, oracle).statistic if np.ptp(proxy) > 0 and np.ptp(oracle) > 0 else float("nan")
    return {"selected_corr": float(oracle[chosen]), "oracle_best": float(oracle.max()),
            "regret": float(oracle.max() - oracle[chosen]), "spread": float(np.ptp(oracle)),
            "spearman": float(rho), "sigma": cells[chosen]["sigma"], "lambda": cells[chosen]["lambda"]}


def mean_sd(values: list[float]) -> dict[str, Any]:
    return {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)), "values": [float(v) for v in values]}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        by.setdefault((run["dataset"], run["variant"]), []).append(run)
    summary: dict[str, Any] = {"cpu_seconds": sum(c["cpu_seconds"] for r in runs for c in r["cells"])}
    for (dataset, variant), group in sorted(by.items()):
        group = sorted(group, key=lambda r: r["seed"])
        grid_cells = {(c["sigma"], c["lambda"]) for c in group[0]["cells"]}
        per_seed = [selection(r["cells"]) for r in group]
        cell_table = {
            f"{s:g}|{lam:g}": {
                key: mean_sd([next(c[key] for c in r["cells"] if (c["sigma"], c["lambda"]) == (s, lam)) for r in group])
                for key in ("test_corr", "val_proxy", "best_epoch", "epochs", "train_mass_median", "eval_mass_median")
            }
            for s, lam in sorted(grid_cells)
        }
        summary[f"{dataset}|{variant}"] = {
            "seeds": [r["seed"] for r in group],
            "selected_corr": mean_sd([p["selected_corr"] for p in per_seed]),
            "oracle_best": mean_sd([p["oracle_best"] for p in per_seed]),
            "regret": mean_sd([p["regret"] for p in per_seed]),
            "selected": [{k: p[k] for k in ("sigma", "lambda")} for p in per_seed],
            "selection_small_grid": [selection(on_grid(r["cells"], *SMALL_GRID)) for r in group]
            if set(itertools.product(*SMALL_GRID)) <= grid_cells else None,
            "worst_slice_gap": mean_sd([r["selected"]["worst_slice_gap"] for r in group]),
            "smece_regions": {
                f"{region}_{method}": mean_sd([r["selected"][f"smece_{region}_{method}"] for r in group])
                for region in ("over", "under") for method in ("base", "iso", "ts", "field")
            },
            "true_regions_smece": {k: mean_sd([r["selected"]["true_regions_smece"][k] for r in group])
                                   for k in ("all", "over", "under")},
            "grid": cell_table,
            "cpu_seconds": sum(c["cpu_seconds"] for r in group for c in r["cells"]),
            "load_average": [r["load_average"] for r in group],
        }
    return summary


def fmt(entry: dict[str, Any], digits: int = 3) -> str:
    return f"{entry['mean']:.{digits}f} ± {entry['sd']:.{digits}f}"


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| data set | variant | selected r (mean ± sd, 3 seeds) | per seed | oracle-best r | regret | selected sigma / lambda per seed |",
             "|---|---|---:|---|---:|---:|---|"]
    for key, s in summary.items():
        if "|" not in key:
            continue
        dataset, variant = key.split("|")
        chosen = ", ".join(f"{c['sigma']:g}/{c['lambda']:g}" for c in s["selected"])
        lines.append(f"| {dataset} | {variant} | {fmt(s['selected_corr'])} | "
                     f"{' / '.join(f'{v:.3f}' for v in s['selected_corr']['values'])} | {fmt(s['oracle_best'])} | "
                     f"{fmt(s['regret'])} | {chosen} |")
    lines += ["", "Appendix E.5 on sigma {0.05, 0.1, 0.2} x lambda {1e-4, 1e-2} (mean ± sd over seeds)", "",
              "| setting | variant | proxy-selected r | oracle-best r | regret | Spearman(-proxy, oracle) | oracle spread |",
              "|---|---|---:|---:|---:|---:|---:|"]
    regrets: dict[str, list[float]] = {}
    for key, s in summary.items():
        rows = s.get("selection_small_grid") if isinstance(s, dict) else None
        if not rows:
            continue
        regrets.setdefault(key.split("|")[1], []).extend(r["regret"] for r in rows)
        cells = [mean_sd([r[name] for r in rows]) for name in ("selected_corr", "oracle_best", "regret", "spearman", "spread")]
        lines.append(f"| {key.split('|')[0]} | {key.split('|')[1]} | " + " | ".join(fmt(c) for c in cells) + " |")
    lines += [f"\nMedian regret over (setting, seed), {variant}: {np.median(values):.3f} ({len(values)} selections)"
              for variant, values in regrets.items()]
    for key, s in summary.items():
        if not key.startswith("sinusoidal_A0.6_k3|") or "paper_lr" in key:
            continue
        lambdas = sorted({float(c.split("|")[1]) for c in s["grid"]})
        sigmas = sorted({float(c.split("|")[0]) for c in s["grid"]})
        lines += ["", f"Figure 10, {key}: test r (mean ± sd over seeds) [median in-batch train-mode mass; mean best epoch]",
                  "", "| sigma | " + " | ".join(f"lambda {lam:g}" for lam in lambdas) + " |",
                  "|---|" + "---:|" * len(lambdas)]
        for sigma in sigmas:
            cells = [s["grid"][f"{sigma:g}|{lam:g}"] for lam in lambdas]
            lines.append(f"| {sigma:g} | " + " | ".join(
                f"{fmt(c['test_corr'])} [{c['train_mass_median']['mean']:.1f}; {c['best_epoch']['mean']:.0f}]" for c in cells) + " |")
    return "\n".join(lines)


def figures(summary: dict[str, Any], runs: list[dict[str, Any]], out: Path) -> None:
    _field_maps(runs, out / "synthetic_fig2_fields.png")
    _sigma_lambda(summary, out / "synthetic_fig10_sigma_lambda.png")
    _amplitude_frequency(summary, out / "synthetic_fig9b_amplitude_frequency.png")
    _proxy_diagnostics(summary, out / "synthetic_fig3_proxy.png")


def _field_maps(runs: list[dict[str, Any]], path: Path) -> None:
    """True and proxy-selected test fields of seed 0, one row per data set (paper Fig. 2a, 9a)."""
    maps = {(r["dataset"], r["variant"]): r["selected"] for r in runs if "test_field" in r["selected"]}
    if not maps:
        return
    fig, axes = plt.subplots(len(MAPPED), 3, figsize=(12, 3.8 * len(MAPPED)), squeeze=False, layout="constrained")
    for row, dataset in enumerate(MAPPED):
        data = make_data(dataset, 0)
        truth = data.true_field["test"]
        panels = [("true field", truth)] + [
            (f"{variant}, sigma {maps[dataset, variant]['sigma']:g}", np.array(maps[dataset, variant]["test_field"]))
            for variant in ("paper", "no_dropout") if (dataset, variant) in maps
        ]
        limit = float(np.abs(truth).max())
        for ax in axes[row][len(panels):]:
            ax.axis("off")
        for ax, (title, values) in zip(axes[row], panels):
            points = ax.scatter(*data.test.x.T, c=values, cmap="coolwarm", vmin=-limit, vmax=limit, s=5)
            ax.set_title(title + ("" if values is truth else f": r = {np.corrcoef(values, truth)[0, 1]:.3f}"), fontsize=9)
        axes[row][0].set_ylabel(f"{dataset} (seed 0)")
        fig.colorbar(points, ax=axes[row].tolist(), shrink=0.8, label="delta (blue: overconfident)")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sigma_lambda(summary: dict[str, Any], path: Path) -> None:
    keys = [k for k in ("sinusoidal_A0.6_k3|paper", "sinusoidal_A0.6_k3|no_dropout") if k in summary]
    if not keys:
        return
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        grid = summary[key]["grid"]
        sigmas = sorted({float(c.split("|")[0]) for c in grid})
        lambdas = sorted({float(c.split("|")[1]) for c in grid})
        values = np.array([[grid[f"{s:g}|{lam:g}"]["test_corr"]["mean"] for lam in lambdas] for s in sigmas])
        spread = np.array([[grid[f"{s:g}|{lam:g}"]["test_corr"]["sd"] for lam in lambdas] for s in sigmas])
        ax.imshow(values, vmin=0.5, vmax=1.0, cmap="viridis")
        for (i, j), v in np.ndenumerate(values):
            ax.text(j, i, f"{v:.3f}\n±{spread[i, j]:.3f}", ha="center", va="center", fontsize=8, color="white" if v < 0.8 else "black")
        ax.set_xticks(range(len(lambdas)), [f"{lam:g}" for lam in lambdas])
        ax.set_yticks(range(len(sigmas)), [f"{s:g}" for s in sigmas])
        ax.set_xlabel("lambda")
        ax.set_ylabel("sigma")
        ax.set_title(f"{key.replace('|', ', ')}: test r, mean ± sd of 3 seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _amplitude_frequency(summary: dict[str, Any], path: Path) -> None:
    amplitudes = sorted({a for a, _ in AK_SETTINGS})
    frequencies = sorted({k for _, k in AK_SETTINGS})
    values = np.full((len(amplitudes), len(frequencies)), np.nan)
    spread = np.full_like(values, np.nan)
    for a, k in AK_SETTINGS:
        entry = summary.get(f"sinusoidal_A{a}_k{k}|no_dropout")
        if entry:
            chosen = [s["selected_corr"] for s in entry["selection_small_grid"]]
            values[amplitudes.index(a), frequencies.index(k)] = np.mean(chosen)
            spread[amplitudes.index(a), frequencies.index(k)] = np.std(chosen, ddof=1)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis")
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.3f}\n±{spread[i, j]:.3f}", ha="center", va="center", fontsize=9, color="white" if v < 0.6 else "black")
    ax.set_xticks(range(len(frequencies)), [str(k) for k in frequencies])
    ax.set_yticks(range(len(amplitudes)), [f"{a:g}" for a in amplitudes])
    ax.set_xlabel("frequency k")
    ax.set_ylabel("amplitude A")
    ax.set_title("no_dropout, proxy-selected test r\n(sigma {0.05, 0.1, 0.2} x lambda {1e-4, 1e-2}; 3 seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _proxy_diagnostics(summary: dict[str, Any], path: Path) -> None:
    points = [(key, s) for key, s in summary.items() if "|" in key and s.get("selection_small_grid")]
    if not points:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key, entry in points:
        rows = entry["selection_small_grid"]
        rho = [r["spearman"] for r in rows]
        left.scatter(rho, [r["regret"] for r in rows], label=key.replace("sinusoidal_", "").replace("|", ", "), s=20)
        right.scatter([r["spread"] for r in rows], rho, s=20)
    left.set_xlabel("Spearman(-proxy, oracle r)")
    left.set_ylabel("regret")
    right.set_xlabel("oracle spread")
    right.set_ylabel("Spearman(-proxy, oracle r)")
    left.legend(fontsize=7)
    fig.suptitle("Proxy selection on sigma {0.05, 0.1, 0.2} x lambda {1e-4, 1e-2}, one point per (setting, seed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report", action="store_true", help="only summarise the runs already in the JSONL file")
    parser.add_argument("--first-group", type=int, default=0,
                        help="start at this index of the plan, e.g. for a second single-threaded runner")
    parser.add_argument("--budget-cpu-minutes", type=float, default=70.0,
                        help="start no new group once the recorded runs have used this much CPU time")
    args = parser.parse_args()
    runs_path = args.out / "synthetic_runs.jsonl"
    if not args.report:
        print(f"cpus={os.cpu_count()} load_average={os.getloadavg()[0]:.2f}", flush=True)
        for group in plan()[args.first_group:]:
            done = {r["key"] for r in read_runs(runs_path)}
            used = sum(c["cpu_seconds"] for r in read_runs(runs_path) for c in r["cells"])
            if group.key in done:
                continue
            if used > 60 * args.budget_cpu_minutes:
                print(f"CPU budget used ({used / 60:.1f} min): stopping before {group.key}", flush=True)
                break
            run = run_group(group)
            with runs_path.open("a") as out:
                out.write(json.dumps(run) + "\n")
            print(f"{group.key}: {sum(c['cpu_seconds'] for c in run['cells']):.0f} CPU s, "
                  f"selected r {selection(run['cells'])['selected_corr']:.3f}", flush=True)
    runs = list(read_runs(runs_path))
    summary = summarise(runs)
    (args.out / "synthetic.json").write_text(json.dumps(summary, indent=1) + "\n")
    figures(summary, runs, args.out)
    print(markdown(summary))


if __name__ == "__main__":
    main()
