"""Real multiruns through the gpu_pool launcher, in a subprocess, against a tiny Hydra app."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

from mice_exp.paths import PACKAGE_ROOT

APP = textwrap.dedent("""\
    import os, time
    import hydra

    @hydra.main(version_base="1.3", config_path=None, config_name=None)
    def task(cfg):
        time.sleep(0.3)  # long enough that both workers take jobs
        with open(os.path.join(cfg.out, f"job{cfg.x}.txt"), "w") as f:
            f.write(f"{os.getpid()}|{os.environ['CUDA_VISIBLE_DEVICES']}|{cfg.x}")
        if cfg.x == cfg.get("fail_on", None):
            raise ValueError(f"job x={cfg.x} fails on purpose")
        return cfg.x

    if __name__ == "__main__":
        task()
""")


def multirun(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, list[tuple[str, str, int]]]:
    (tmp_path / "app.py").write_text(APP)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # hydra_plugins/ is found from the checkout (until it is packaged, see pyproject's packages.find)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(PACKAGE_ROOT), env.get("PYTHONPATH", "")] if p)
    done = subprocess.run(
        [sys.executable, "app.py", "-m", f"hydra.searchpath=[file://{PACKAGE_ROOT / 'conf'}]",
         f"hydra.sweep.dir={tmp_path / 'sweep'}", f"+out={out}", "+x=1,2,3,4", *overrides],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    rows = []
    for path in sorted(out.glob("job*.txt")):
        pid, device, x = path.read_text().split("|")
        rows.append((pid, device, int(x)))
    return done, rows


@pytest.mark.slow
def test_cpu_pool_runs_four_jobs_on_two_cpu_workers(tmp_path):
    done, rows = multirun(tmp_path, "hydra/launcher=cpu_pool", "hydra.launcher.n_cpu_workers=2")
    assert done.returncode == 0, done.stderr
    assert sorted(x for _, _, x in rows) == [1, 2, 3, 4]
    assert len({pid for pid, _, _ in rows}) == 2  # two worker processes shared the four jobs
    assert {device for _, device, _ in rows} == {""}  # CUDA_VISIBLE_DEVICES="" on CPU workers
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["0", "1", "2", "3"]
    assert "launching 4 jobs on 2 CPU worker(s)" in done.stdout + done.stderr


@pytest.mark.slow
def test_gpu_pool_pins_one_gpu_per_worker_and_survives_a_failing_job(tmp_path):
    # a fake list of GPU ids: nothing here touches CUDA, the jobs only read CUDA_VISIBLE_DEVICES
    done, rows = multirun(tmp_path, "hydra/launcher=gpu_pool", "hydra.launcher.gpus=[0,1]", "+fail_on=2")
    assert done.returncode == 1  # Hydra re-raises the failed job's error after the sweep...
    assert "job x=2 fails on purpose" in done.stderr
    assert sorted(x for _, _, x in rows) == [1, 2, 3, 4]  # ...and every other job still ran
    devices = defaultdict(set)
    for pid, device, _ in rows:
        devices[pid].add(device)
    assert len(devices) == 2 and all(len(d) == 1 for d in devices.values())
    assert set().union(*devices.values()) == {"0", "1"}
