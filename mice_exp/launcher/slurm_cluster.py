"""What a Slurm cluster says, in one line: its partitions and nodes (``sinfo``), an array's tasks
(``squeue``), and sbatch's refusals naming the resource or partition (:func:`explain_sbatch_error`).

Every question is a subprocess that may be missing or fail; the answers are worded for the launcher's
messages (:mod:`mice_exp.launcher.slurm`). Nothing here imports Hydra, torch or the app.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

#: PENDING reasons that never clear by waiting: the request exceeds what the partition or account allows.
UNRUNNABLE = {
    "PartitionConfig": "no node of the partition can give what one task asks",
    "PartitionNodeLimit": "the job asks more nodes than the partition allows",
    "PartitionTimeLimit": "timeout_min is above the partition's time limit",
    "BadConstraints": "no node satisfies the constraints",
    "InvalidQOS": "the QOS is not valid for this account",
    "InvalidAccount": "the account is not valid",
}
#: What common PENDING reasons mean (squeue's %r).
PENDING_HINTS = {
    "Resources": "waiting for CPUs / memory / GPUs to free up",
    "Priority": "jobs of higher priority go first",
    "JobArrayTaskLimit": "array_parallelism tasks already run",
    "ReqNodeNotAvail": "the nodes it needs are down, drained or reserved",
    "QOSMaxCpuPerUserLimit": "your QOS's CPU limit is reached",
    "AssocGrpCpuLimit": "your account's CPU limit is reached",
    "BeginTime": "waiting for its start time",
    "Dependency": "waiting for another job",
    **UNRUNNABLE,
}
#: the commands submitit runs (its executor refuses to start without srun) and this launcher's waiting asks
CLIENT = ("sbatch", "srun", "squeue", "sacct")


def missing_client() -> str | None:
    """The one line for a machine without Slurm's client (None when it has one), said before the sweep
    opens its MLflow run rather than as submitit's ``RuntimeError`` after it."""
    missing = [name for name in CLIENT if shutil.which(name) is None]
    if not missing:
        return None
    return (f"slurm launcher: no Slurm client on this machine ({', '.join(missing)} not in PATH); expected a "
            "Slurm login node, or a launcher of this machine: hydra/launcher=cpu_pool (or gpu_pool)")


def _slurm(*args: str, timeout_s: float = 30.0) -> str | None:
    """A Slurm command's stdout, or None when it is missing or fails."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def partitions() -> list[str]:
    """The cluster's partitions, the default one marked ``*`` as sinfo marks it."""
    out = _slurm("sinfo", "-h", "-o", "%P") or ""
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def node_summary(partition: str | None) -> str:
    """``vm: 2 CPUs, 23081 MB`` for each kind of node of ``partition`` (the default one when None)."""
    args = ["sinfo", "-h", "-N", "-o", "%N|%c|%m|%G"]
    if partition:
        args[1:1] = ["-p", partition]
    else:
        default = [p for p in partitions() if p.endswith("*")]
        if default:
            args[1:1] = ["-p", default[0].rstrip("*")]
    out = _slurm(*args)
    if not out:
        return "unknown (sinfo did not answer)"
    kinds: dict[str, list[str]] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        node, cpus, mem, gres = parts
        kind = f"{cpus} CPUs, {mem} MB" + ("" if gres in ("(null)", "") else f", gres {gres}")
        kinds.setdefault(kind, []).append(node)
    return "; ".join(f"{','.join(sorted(set(nodes))[:3])}{'...' if len(set(nodes)) > 3 else ''}: {kind}"
                     for kind, nodes in kinds.items()) or "none"


def squeue_tasks(job_id: str) -> dict[str, tuple[str, str]] | None:
    """The active tasks of array (or job) ``job_id``: task id -> (state, reason); None when squeue fails."""
    out = _slurm("squeue", "-h", "-r", "-j", job_id, "-o", "%i|%T|%r")
    if out is None:
        return None
    tasks = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            tasks[parts[0]] = (parts[1], parts[2])
    return tasks


def asked(params: dict[str, Any]) -> str:
    """What one array task asks, in words: ``2 CPUs, 8 GB, 1 GPU, partition debug, 240 min``."""
    words = []
    if params.get("cpus_per_task"):
        words.append(f"{params['cpus_per_task']} CPUs (cpus_per_task)")
    if params.get("mem_gb"):
        words.append(f"{params['mem_gb']} GB (mem_gb)")
    for key in ("gpus_per_task", "gpus_per_node", "gres", "constraint"):
        if params.get(key):
            words.append(f"{key}={params[key]}")
    words.append(f"partition {params.get('partition') or 'default'}")
    if params.get("timeout_min"):
        words.append(f"{params['timeout_min']} min")
    return ", ".join(words)


def explain_sbatch_error(text: str, params: dict[str, Any]) -> str:
    """One line from sbatch's refusal: which resource or partition, what the cluster has, what to change."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line.split("error:", 1)[1].strip() for line in lines if "error:" in line] or lines[-1:]
    said = "; ".join(dict.fromkeys(errors)) or "no message"
    low = said.lower()
    partition = params.get("partition")
    where = f"partition {partition}" if partition else "the default partition"
    if "invalid partition" in low:
        return (f"slurm launcher: Slurm has no partition {partition!r} (hydra.launcher.partition); its partitions: "
                f"{', '.join(partitions()) or 'unknown (sinfo did not answer)'} (sbatch: {said})")
    if "gres" in low or "gpu" in low:
        return (f"slurm launcher: sbatch refused the GPU request ({asked(params)}): {said}; nodes of {where}: "
                f"{node_summary(partition)}. On CPU nodes use hydra/launcher=slurm (no GPU); for GPUs "
                f"hydra/launcher=slurm_gpu with a GPU partition (hydra.launcher.partition=...)")
    if "node configuration is not available" in low or "memory specification" in low or "cpu count" in low:
        return (f"slurm launcher: no node of {where} can give one task what it asks ({asked(params)}): {said}; "
                f"its nodes: {node_summary(partition)}. Lower hydra.launcher.cpus_per_task / mem_gb or pick "
                "another partition")
    return f"slurm launcher: sbatch refused the array ({asked(params)}): {said}"
