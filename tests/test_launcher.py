"""The launchers' parts: gpu_pool's GPU counting without CUDA, one device per worker, the pool; configs; the
Slurm launcher's messages (its run on a real Slurm is tests/test_slurm.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import defaultdict

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mice_exp.devices import parse_nvidia_smi, parse_visible_devices, visible_gpus
from mice_exp.launcher.gpus import LauncherConfigError, plan_workers
from mice_exp.launcher.pool import WorkerDied, run_on_devices
from mice_exp.paths import PACKAGE_ROOT

REPO = PACKAGE_ROOT
if str(REPO) not in sys.path:  # hydra_plugins/ is only importable from the checkout until it is packaged
    sys.path.insert(0, str(REPO))

SMI = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-66666666-7777-8888-9999-000000000000)
"""
SMI_MIG = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa)
  MIG 3g.20gb     Device  0: (UUID: MIG-bbbb)
  MIG 3g.20gb     Device  1: (UUID: MIG-cccc)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-dddd)
"""


def no_smi() -> str:
    raise AssertionError("nvidia-smi must not be asked when CUDA_VISIBLE_DEVICES is set")


# --- counting GPUs -------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    ("0,1", ["0", "1"]), ("2, 3", ["2", "3"]), ("", []), ("-1", []), ("0,-1,1", ["0"]),
    ("GPU-abc,MIG-def", ["GPU-abc", "MIG-def"]), ("1,", ["1"]),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, expected):
    assert parse_visible_devices(value) == expected


def test_nvidia_smi_lists_gpus_or_their_mig_instances():
    assert parse_nvidia_smi(SMI) == ["0", "1"]
    assert parse_nvidia_smi(SMI_MIG) == ["MIG-bbbb", "MIG-cccc", "1"]
    assert parse_nvidia_smi("") == []


def test_visible_gpus_prefers_the_environment_then_nvidia_smi():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "4,6"}, no_smi) == ["4", "6"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, no_smi) == []  # set but empty: no GPU
    assert visible_gpus({}, lambda: SMI) == ["0", "1"]
    assert visible_gpus({}, lambda: "") == []  # no nvidia-smi: a CPU machine


def test_counting_gpus_and_loading_the_plugin_never_import_torch():
    code = (
        "import sys\n"
        "from mice_exp.launcher import gpus, pool, hydra_jobs\n"
        "import hydra_plugins.mice_exp_launcher.gpu_pool_launcher, hydra_plugins.mice_exp_launcher.config\n"
        "import hydra_plugins.mice_exp_launcher.slurm_launcher\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.launcher import Launcher\n"
        "gpus.plan_workers(4)\n"
        "names = [c.__name__ for c in Plugins.instance().discover(Launcher)]\n"
        "assert 'GpuPoolLauncher' in names and 'MiceSlurmLauncher' in names, names\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'submitit' not in sys.modules, 'submitit was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# --- one GPU per worker ---------------------------------------------------------------------------

def test_one_distinct_gpu_per_worker_by_default():
    plan = plan_workers(10, environ={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, nvidia_smi=no_smi)
    assert plan.on_gpu and plan.devices == ("0", "1", "2", "3")
    plan = plan_workers(10, environ={}, nvidia_smi=lambda: SMI)
    assert plan.devices == ("0", "1")


def test_explicit_gpus_and_worker_counts():
    assert plan_workers(10, gpus=[5, 7], nvidia_smi=no_smi).devices == ("5", "7")
    assert plan_workers(10, gpus=["5", "7", "9"], n_workers=2).devices == ("5", "7")
    assert plan_workers(2, gpus=["5", "7", "9"]).devices == ("5", "7")  # never more workers than jobs
    with pytest.raises(LauncherConfigError, match="each worker owns exactly one GPU"):
        plan_workers(10, gpus=["0", "1"], n_workers=3)
    with pytest.raises(LauncherConfigError, match="twice"):
        plan_workers(10, gpus=["0", "0"])


def test_cpu_workers_without_gpus_or_when_forced():
    plan = plan_workers(10, environ={}, nvidia_smi=lambda: "", n_cpu_workers=3)
    assert not plan.on_gpu and plan.devices == ("", "", "")
    assert plan_workers(10, gpus=[], n_workers=2).devices == ("", "")
    assert plan_workers(10, gpus=["0", "1"], mode="cpu").devices == ("", "")
    assert plan_workers(1, gpus=[]).devices == ("",)
    with pytest.raises(LauncherConfigError, match="no GPU"):
        plan_workers(10, gpus=[], mode="gpu")
    with pytest.raises(LauncherConfigError, match="mode"):
        plan_workers(10, mode="tpu")


# --- the pool: real spawned workers ---------------------------------------------------------------

def report_device(item):
    time.sleep(0.2)  # long enough that both workers take jobs
    if item == "raise":
        raise ValueError("this job fails")
    if item == "crash":
        os._exit(5)
    return item, os.getpid(), os.environ["CUDA_VISIBLE_DEVICES"]


def devices_by_pid(outcomes):
    seen = defaultdict(set)
    for outcome in outcomes:
        if outcome.ok:
            _, pid, device = outcome.value
            assert (pid, device) == (outcome.pid, outcome.device)
            seen[pid].add(device)
    return seen


def test_each_worker_keeps_its_own_gpu_across_jobs():
    outcomes = run_on_devices(report_device, list(range(6)), ["3", "5"])
    assert [o.value[0] for o in outcomes] == list(range(6))  # in order
    seen = devices_by_pid(outcomes)
    assert len(seen) == 2  # two workers, each ran several jobs
    assert all(len(devices) == 1 for devices in seen.values())  # a worker never changes device
    assert set().union(*seen.values()) == {"3", "5"}  # and the two devices are distinct


def test_a_failing_or_crashing_job_fails_alone():
    items = [0, "raise", "crash", 3, 4, 5]
    outcomes = run_on_devices(report_device, items, ["0", "1"])
    assert [o.ok for o in outcomes] == [True, False, False, True, True, True]
    assert isinstance(outcomes[1].error, ValueError)
    if sys.version_info >= (3, 11):  # the worker's traceback survives the trip as a note
        notes = "".join(outcomes[1].error.__notes__)
        assert "Traceback" in notes and "report_device" in notes
    assert isinstance(outcomes[2].error, WorkerDied) and "exit code 5" in str(outcomes[2].error)
    crashed_on = outcomes[2].device
    seen = devices_by_pid(outcomes)
    assert all(len(devices) == 1 for devices in seen.values())
    # the crashed worker's place was refilled on the same GPU
    assert sum(devices == {crashed_on} for devices in seen.values()) >= 1
    assert set().union(*seen.values()) <= {"0", "1"}


def test_cpu_workers_hide_every_gpu():
    outcomes = run_on_devices(report_device, [0, 1, 2], ["", ""])
    assert {o.value[2] for o in outcomes} == {""}


# --- configs --------------------------------------------------------------------------------------

def launcher_cfg(name: str):
    import hydra_plugins.mice_exp_launcher.config  # noqa: F401 - registers mice_exp_gpu in the ConfigStore

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={name}"], return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=False)


def test_gpu_pool_and_cpu_pool_configs():
    gpu = launcher_cfg("gpu_pool")
    assert gpu["_target_"] == "hydra_plugins.mice_exp_launcher.gpu_pool_launcher.GpuPoolLauncher"
    assert (gpu["gpus"], gpu["n_workers"], gpu["n_cpu_workers"], gpu["mode"]) == (None, None, 2, "auto")
    assert launcher_cfg("cpu_pool")["mode"] == "cpu"


def test_slurm_config_is_cpu_only_by_default_and_slurm_gpu_asks_one_gpu_per_job():
    slurm = launcher_cfg("slurm")
    assert slurm["_target_"] == "hydra_plugins.mice_exp_launcher.slurm_launcher.MiceSlurmLauncher"
    assert (slurm["gpus_per_task"], slurm["gpus_per_node"], slurm["gres"]) == (None, None, None)  # a CPU cluster
    assert slurm["cpus_per_task"] <= 2 and slurm["mem_gb"] <= 8  # fits a small node
    assert (slurm["tasks_per_node"], slurm["nodes"], slurm["name"]) == (1, 1, "auto")
    for key in ("timeout_min", "partition", "array_parallelism", "poll_s", "cancel_unrunnable", "skip_finished"):
        assert key in slurm
    gpu = launcher_cfg("slurm_gpu")
    assert gpu["_target_"] == slurm["_target_"]
    assert (gpu["gpus_per_task"], gpu["cpus_per_task"], gpu["mem_gb"]) == (1, 8, 64)


def test_the_slurm_launcher_keeps_its_own_options_out_of_sbatch():
    from hydra_plugins.mice_exp_launcher.slurm_launcher import MiceSlurmLauncher

    launcher = MiceSlurmLauncher(submitit_folder="f", partition="debug", name="auto", poll_s=3,
                                 cancel_unrunnable=False, skip_finished=True)
    assert (launcher.poll_s, launcher.cancel_unrunnable, launcher.skip_finished) == (3.0, False, True)
    assert launcher.params == {"submitit_folder": "f", "partition": "debug", "name": "auto"}


# --- the Slurm launcher's messages (the real cluster is tests/test_slurm.py) -----------------------

SLURM_PARAMS = {"partition": None, "cpus_per_task": 8, "mem_gb": 64, "gpus_per_task": 1, "timeout_min": 240}


@pytest.mark.parametrize("stderr, expected", [
    ("sbatch: error: Invalid generic resource (gres) specification",
     r"sbatch refused the GPU request \(8 CPUs .*gpus_per_task=1.*\): Invalid generic resource \(gres\) "
     r"specification; nodes of the default partition: vm: 2 CPUs, 23081 MB\. On CPU nodes use hydra/launcher=slurm"),
    ("sbatch: error: Memory specification can not be satisfied\n"
     "sbatch: error: Batch job submission failed: Requested node configuration is not available",
     r"no node of the default partition can give one task what it asks \(8 CPUs \(cpus_per_task\), 64 GB \(mem_gb\)"
     r".*Requested node configuration is not available; its nodes: vm: 2 CPUs, 23081 MB\. Lower"),
    ("sbatch: error: invalid partition specified: nope\n"
     "sbatch: error: Batch job submission failed: Invalid partition name specified",
     r"Slurm has no partition 'nope' \(hydra\.launcher\.partition\); its partitions: debug\*"),
    ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy",
     r"sbatch refused the array \(.*\): Batch job submission failed: Job violates accounting/QOS policy$"),
])
def test_sbatch_refusals_become_one_line_naming_the_resource(monkeypatch, stderr, expected):
    from mice_exp.launcher import slurm_cluster

    monkeypatch.setattr(slurm_cluster, "partitions", lambda: ["debug*"])
    monkeypatch.setattr(slurm_cluster, "node_summary", lambda partition: "vm: 2 CPUs, 23081 MB")
    params = {**SLURM_PARAMS, "partition": "nope"} if "partition" in stderr else SLURM_PARAMS
    line = slurm_cluster.explain_sbatch_error(stderr, params)
    assert "\n" not in line and line.startswith("slurm launcher: ")
    assert re.search(expected, line), line


def test_pending_reasons_are_summed_up_in_one_line():
    from mice_exp.launcher.slurm import _label, describe

    labels = [_label("RUNNING", "None"), _label("PENDING", "Resources"), _label("PENDING", "Resources"),
              _label("PENDING", "None")]
    assert describe("12", labels) == ("slurm job 12_[0-3]: 1 RUNNING, 2 PENDING (Resources: waiting for CPUs / memory "
                                      "/ GPUs to free up), 1 PENDING")
    assert describe("13", ["done"]) == "slurm job 13: 1 done"


def test_a_failed_jobs_own_error_line_is_found_in_its_log(tmp_path):
    from mice_exp.launcher.slurm import _last_error_line

    log = tmp_path / "log.err"
    log.write_text("Traceback (most recent call last):\n  File x\nValueError: bad value\nsrun: error: task 0\n")
    assert _last_error_line(log) == "ValueError: bad value"
    log.write_text("progress 10%\nmice-exp: error: llm.batch_size=0; expected a positive integer\nsrun: error: x\n")
    assert _last_error_line(log) == "mice-exp: error: llm.batch_size=0; expected a positive integer"
    assert _last_error_line(tmp_path / "missing.err") is None
