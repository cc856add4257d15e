"""Screenshot of the MLflow runs table as the printed link opens it, in a real headless browser.

    python benchmarks/mlflow_ui_screenshot.py            # writes docs/mlflow_runs.png

Logs a few runs into a fresh SQLite store with the project's tracking code (the metric names,
run names and experiment tags a ``mice-exp`` job writes; the values are scored on synthetic
predictions, so no LLM runs), starts ``mlflow ui`` on it, opens the link a job prints in
Debian's chromium (``apt-get install -y chromium``) and saves what the browser shows.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mice_exp.estimation import risks_from  # noqa: E402
from mice_exp.metrics import evaluate  # noqa: E402
from mice_exp.tracking import tracked_run  # noqa: E402
from mice_exp.tracking.dashboard import experiment_link, run_name  # noqa: E402

#: Estimator key and how informative its synthetic confidence is (0: noise).
ESTIMATORS = {"raw": 0.1, "hre": 0.2, "nwkr": 0.25, "mice_lr": 0.35, "mice_rf": 0.45, "probe_last": 0.3,
              "mahalanobis": 0.15}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def log_runs(uri: str, root: Path, llm: str = "smollm2_135m", n: int = 120, seed: int = 0) -> str:
    """One holdout run per estimator, as ``mice-exp llm=LLM estimator=KEY`` would log it; returns the experiment id."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.45).astype(int)
    risks = risks_from({"name": "medium", "tp": 1, "fp": -1, "tn": 0, "fn": 0})
    for key, signal in ESTIMATORS.items():
        p = np.clip(0.45 + signal * (2 * y - 1) + rng.normal(0, 0.2, n), 0, 1)
        tags = {"llm": llm, "dataset": "ste", "features": "bertscore", "estimator": key, "protocol": "holdout",
                "risk": "medium"}
        with tracked_run({"uri": uri, "experiment": "mice_exp"}, root, run_name=run_name(tags), tags=tags) as run:
            run.log_metrics(evaluate(p, y, risks))
    return run.experiment_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"mlflow ui did not answer at {url} within {timeout_s:.0f} s")


def screenshot(url: str, out: Path, profile: Path, chromium: str, size: str = "1920,1080") -> None:
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                    "--virtual-time-budget=15000", f"--screenshot={out}", url],
                   check=True, capture_output=True, timeout=180,
                   env={**os.environ, "TMPDIR": str(profile.parent)})  # its socket directory: /tmp may be read-only


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "mlflow_runs.png")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mice-ui-") as tmp:
        tmp = Path(tmp)
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        experiment = log_runs(uri, tmp)
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                                   "--host", "127.0.0.1", "--port", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for(f"{base}/health")
            url = experiment_link(base, experiment)  # the printed link, on this server's port
            print(f"opening {url}")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            screenshot(url, args.out, tmp / "chromium-profile", args.chromium)
        finally:  # the server's workers share its process group: end them all with it
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
