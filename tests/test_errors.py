"""Every user error and environment fault ends in one line (exit 2, no traceback), before any model
loads where it can; every ``--help`` prints usage without running anything; results computed before
a tracking failure are still printed."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import cache_sharing_models
from mice_exp.compose import as_plain, compose_config
from mice_exp.config import check_config
from mice_exp.paths import PACKAGE_ROOT

FIXTURE = PACKAGE_ROOT / "tests" / "fixtures" / "ste_tiny.json"


def base(tmp: Path, cache: Path | None = None) -> list[str]:
    """A tiny_random run on 6 calls whose cache reuses the project's converted tokenizer."""
    cache = cache_sharing_models(cache or tmp / "cache")
    return ["llm=tiny_random", f"dataset.path={FIXTURE}", "llm.batch_size=2", "llm.max_new_tokens=4",
            "prompt.k_demos=1", f"paths.cache={cache}", "tracking.enabled=false", f"hydra.run.dir={tmp / 'out'}"]


def cli(monkeypatch, capsys, args: list[str]) -> tuple[int, str, str]:
    """``mice-exp ARGS`` in this process: exit status, stdout, stderr."""
    from mice_exp.__main__ import main

    monkeypatch.setattr(sys, "argv", ["mice-exp", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def one_error_line(err: str) -> str:
    """The single ``mice-exp: error:`` line of stderr (progress bars aside), with no traceback."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "mice-exp: error:" in line]
    assert len(errors) == 1, err
    return errors[0]


# Bad values: each fails in check_config, before data, models or MLflow are touched.
CONFIG_ERRORS = [
    (["llm.batch_size=0"], "llm.batch_size=0; expected a positive integer"),
    (["+tau=nan"], "tau=nan is not a setting: nothing reads it"),
    (["llm.max_new_tokens=0"], "llm.max_new_tokens=0; expected a positive integer"),
    (["llm.context_window=4", "llm.max_new_tokens=4"], "llm.context_window=4 leaves no room for a prompt"),
    (["seed=abc"], "seed='abc'; expected an integer"),
    (["permutations=-1"], "permutations=-1; expected a non-negative integer"),
    (["n_jobs=0"], "n_jobs=0; expected a non-zero integer"),
    (["prompt.k_demos=-2"], "prompt.k_demos=-2; expected a non-negative integer"),
    (["llm.dtype=float8"], "llm.dtype='float8'; expected one of auto, float32, bfloat16, float16"),
    (["llm.device=gpu"], "llm.device='gpu'; expected cpu, cuda, cuda:N, mps or auto"),
    (["features.encoder.batch_size=0"], "features.encoder.batch_size=0; expected a positive integer"),
    (["risk=custom", "risk.fp=-inf"], "risk.fp=-inf; expected a finite number"),
    (["risk.tp=nan"], "risk.tp=nan; expected a finite number"),
    (["+risk.tau=nan"], "risk.tau=nan: not a risk setting"),
    (["estimator=field", "estimator.model.val_fraction=1.5"],
     "estimator.model.val_fraction=1.5; expected a probability strictly between 0 and 1"),
    (["protocol=sample_efficiency", "protocol.trials=0"], "protocol.trials=0; expected a positive integer"),
    (["features.sources=[verbalized]", "sources.use=[]"],
     "features=bertscore (features.sources) reads the verbalized confidence source, which sources.use=[] does not "
     "compute; expected sources.use=[verbalized]"),
    (["compare_with=[raw,consistency]", "sources.use=[p_true]"],
     "estimator consistency reads the consistency confidence source"),
    (["estimator=probe_last", "estimator.model.representation=last"],
     "estimator probe_last reads representation='last', which the LLM stage does not keep"),
    (["dataset.split.train=0"], "dataset.split.train=0: the estimators need training calls"),
    (["protocol=loao", "dataset.max_apis=1"], "protocol=loao leaves one API out at a time, so it needs at least 2 APIs"),
    (["tracking.enabled=true", "tracking.uri=foo://x"], "tracking.uri='foo://x': unknown scheme 'foo'"),
    (["dataset.path=${nope}"], "dataset.path: Interpolation key 'nope' not found; expected a value"),
]


@pytest.mark.parametrize("bad, expected", CONFIG_ERRORS, ids=[" ".join(b) for b, _ in CONFIG_ERRORS])
def test_a_bad_value_is_one_line_before_anything_loads(tmp_path, monkeypatch, capsys, bad, expected):
    from mice_exp.llm import model

    monkeypatch.setattr(model, "load_hf", lambda *a, **k: pytest.fail("a model was loaded"))
    code, out, err = cli(monkeypatch, capsys, [*base(tmp_path), *bad])
    assert code == 2 and err.strip().splitlines() == [one_error_line(err)]
    assert expected in err, err


def test_a_mistyped_subcommand_names_the_subcommands(monkeypatch, capsys):
    code, _, err = cli(monkeypatch, capsys, ["reprot", "--sweep", "multirun/x"])
    assert code == 2 and err.strip() == ("mice-exp: error: unknown command 'reprot'; expected one of inspect, "
                                         "report, gate, serve, records, mcq, ui, claude-hook or key=value overrides (mice-exp --help)")


def test_the_gate_refuses_the_values_the_main_command_refuses(tmp_path, monkeypatch, capsys):
    for bad, expected in [("risk.fp=nan", "risk.fp=nan; expected a finite number"),
                          ("+risk.tau=nan", "risk.tau=nan: not a risk setting"),
                          ("risk.tau=nan", "Could not override 'risk.tau'")]:
        code, _, err = cli(monkeypatch, capsys, ["gate", f"model={tmp_path}", f"input={FIXTURE}", bad])
        assert code == 2 and expected in one_error_line(err)


def test_every_accepted_dtype_passes_validation():
    for dtype in ("auto", "float32", "bfloat16", "float16"):
        check_config(as_plain(compose_config(["llm=tiny_random", f"llm.dtype={dtype}"])))


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def one_api_jsonl(tmp: Path) -> Path:
    rows = [{"id": i, "api": "add_date", "query": f"q{i}", "tools": [{"name": "add_date"}],
             "gold": {"action": "add_date", "action_input": {"days": i}}} for i in range(6)]
    return write(tmp / "one_api.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


# Bad data and model folders: named in one line once the data is read, before any model loads.
DATA_ERRORS = [
    (lambda t: ["dataset=jsonl", f"dataset.path={write(t / 'empty.jsonl', '')}"], "empty.jsonl': no examples"),
    (lambda t: ["dataset=jsonl", "dataset.path=" + str(write(t / "blank.jsonl", "  \n\n"))], "blank.jsonl': no examples"),
    (lambda t: [f"dataset.path={write(t / 'empty.json', '{}')}"], "empty.json': no examples"),
    (lambda t: ["dataset=jsonl", f"dataset.path={one_api_jsonl(t)}", "protocol=loao"],
     "protocol=loao needs at least 2 APIs; the data set has only 'add_date'"),
    (lambda t: ["llm=llama3_2_3b_instruct", f"llm.source.path={t}"], "has no config.json; expected a model folder"),
]


@pytest.mark.parametrize("make, expected", DATA_ERRORS, ids=["empty jsonl", "blank jsonl", "empty ste", "loao one api",
                                                             "empty model folder"])
def test_bad_data_or_model_folder_is_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys, make, expected):
    from mice_exp.llm import model

    monkeypatch.setattr(model, "load_hf", lambda *a, **k: pytest.fail("a model was loaded"))
    (tmp_path / "data").mkdir()
    code, _, err = cli(monkeypatch, capsys, [*base(tmp_path), *make(tmp_path / "data")])
    assert code == 2 and expected in one_error_line(err), err


HELP = [["--help"], ["-h"], ["inspect", "--help"], ["inspect", "-h"], ["gate", "--help"], ["gate", "-h"],
        ["serve", "--help"], ["report", "--help"], ["report", "-h"], ["records", "--help"], ["ui", "-h"]]
#: Prints, after the command, which heavy libraries it imported: help must load no model library.
HELP_PROBE = ("import sys\nfrom mice_exp.__main__ import main\nsys.argv = ['mice-exp', *sys.argv[1:]]\n"
              "try:\n    main()\nexcept SystemExit as end:\n    assert not end.code, end.code\n"
              "print('LOADED', [m for m in ('torch', 'transformers', 'sklearn') if m in sys.modules])\n")


@pytest.mark.parametrize("args", HELP, ids=" ".join)
def test_help_prints_usage_fast_without_running_anything(tmp_path, args):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)}  # this checkout, whatever is installed
    proc = subprocess.run([sys.executable, "-c", HELP_PROBE, *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: mice-exp"), proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "LOADED []"
    # CPU seconds, not wall time: the bound holds on a machine busy with other jobs (~0.5 s when quiet)
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 5
    if args[0] in ("-h", "--help"):
        assert all(name in proc.stdout for name in ("inspect", "gate", "report", "--hydra-help", "--cfg job"))


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """A folder nothing can be written in. Root ignores permission bits, so for root the one write the
    check makes (a probe file) is refused as a read-only mount would refuse it."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    real = tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve().is_relative_to(folder.resolve()):
            raise OSError(errno.EROFS, "Read-only file system", str(dir))
        return real(*args, dir=dir, **kwargs)

    folder.chmod(0o555)
    if os.geteuid() == 0:
        monkeypatch.setattr(tempfile, "mkstemp", refuse)
    yield folder
    folder.chmod(0o755)


def test_a_read_only_cache_folder_is_one_line_naming_it(tmp_path, read_only, monkeypatch, capsys):
    code, _, err = cli(monkeypatch, capsys, [*base(tmp_path), f"paths.cache={read_only / 'cache'}"])
    line = one_error_line(err)
    assert code == 2 and f"paths.cache='{read_only / 'cache'}' is not writable" in line
    assert "pass paths.cache=" in line


@pytest.fixture(scope="module")
def stage_cache(tmp_path_factory) -> Path:
    """One LLM-stage cache shared by the tracking tests (they differ only in where the run is logged)."""
    return tmp_path_factory.mktemp("stage") / "cache"


def tracked(tmp: Path, cache: Path, uri: str) -> list[str]:
    return [*base(tmp, cache), "stage=llm", "tracking.enabled=true", f"tracking.uri={uri}"]


def test_a_tracking_server_that_is_down_costs_the_log_not_the_results(tmp_path, stage_cache, monkeypatch, capsys):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, out, err = cli(monkeypatch, capsys, tracked(tmp_path, stage_cache, f"http://127.0.0.1:{port}"))
    line = one_error_line(err)
    assert code == 2 and "tool calls correct" in out
    assert f"tracking.uri=http://127.0.0.1:{port}: no MLflow server answers" in line
    assert "nothing was logged to MLflow" in line


@pytest.mark.parametrize("existing", [True, False], ids=["existing store", "empty folder"])
def test_a_read_only_store_costs_the_log_not_the_results(tmp_path, stage_cache, read_only, monkeypatch, capsys,
                                                         existing):
    built = tmp_path / "mlruns"
    built.mkdir()
    if existing:  # a migrated store made by MLflow itself, outside the project's cached clients
        from mlflow import MlflowClient

        MlflowClient(f"sqlite:///{built / 'mlflow.db'}").search_experiments()
    store = read_only / "mlruns"
    read_only.chmod(0o755)
    shutil.move(built, store)
    read_only.chmod(0o555)
    store.chmod(0o555)
    code, out, err = cli(monkeypatch, capsys, tracked(tmp_path, stage_cache, f"sqlite:///{store / 'mlflow.db'}"))
    store.chmod(0o755)
    line = one_error_line(err)
    assert code == 2 and "tool calls correct" in out
    assert f"the MLflow store {store} is not writable" in line and "tracking.enabled=false" in line
    assert "nothing was logged to MLflow" in line


def test_a_store_failing_mid_run_keeps_the_printed_results(tmp_path, stage_cache, monkeypatch, capsys):
    from mlflow import MlflowClient
    from sqlalchemy.exc import OperationalError

    real = MlflowClient.log_batch

    def read_only_for_metrics(self, run_id, metrics=(), **kwargs):
        if metrics:
            raise OperationalError("INSERT", {}, Exception("attempt to write a readonly database"))
        return real(self, run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", read_only_for_metrics)
    code, out, err = cli(monkeypatch, capsys, tracked(tmp_path, stage_cache, f"sqlite:///{tmp_path / 'mlflow.db'}"))
    line = one_error_line(err)
    assert code == 2 and "tool calls correct" in out
    assert "attempt to write a readonly database" in line and "the rest of this run was not logged" in line


def test_a_full_disk_during_the_llm_stage_is_one_line_saying_what_was_kept(tmp_path, monkeypatch, capsys):
    from mice_exp.llm import stage

    real, written = stage.write_jsonl, []

    def full_after_one_shard(path, rows):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        written.append(path)
        real(path, rows)

    monkeypatch.setattr(stage, "write_jsonl", full_after_one_shard)
    code, _, err = cli(monkeypatch, capsys, [*base(tmp_path), "stage=llm"])
    line = one_error_line(err)
    assert code == 2 and "(No space left on device); 1 complete shards kept in" in line
    assert "a re-run resumes" in line


# Output paths: checked before any work (a gate batch or an LLM stage is minutes to hours of it). The cases
# issue 29 found (records: empty, the project, an existing file, read-only; gate: a folder, read-only) are rows
# of tests/test_bad_input.py.
OUTPUT_ERRORS = [
    ("records", lambda tmp: str(tmp), "is a folder"),
    ("gate", lambda tmp: "", "output is empty; expected the path of a file to write"),
    ("gate", lambda tmp: str(PACKAGE_ROOT), "is a folder"),
    ("gate", lambda tmp: str(tmp / "there.jsonl"), "exists; pass force=true to replace it"),
]


@pytest.mark.parametrize("command, output, expected", OUTPUT_ERRORS,
                         ids=["records a folder", "gate empty", "gate the project", "gate an existing file"])
def test_a_bad_output_path_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, command, output, expected):
    (tmp_path / "there.jsonl").write_text("kept\n")
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"query": "What is the date today?", "tools": "get_today_date"}) + "\n")
    args = [f"output={output(tmp_path)}", *base(tmp_path)]
    if command == "gate":  # the model never loads: the output is refused first
        args = [f"model={tmp_path / 'no-gate'}", f"input={queries}", *args]
    code, out, err = cli(monkeypatch, capsys, [command, *args])
    assert code == 2 and expected in one_error_line(err)
    assert (tmp_path / "there.jsonl").read_text() == "kept\n"
    assert not list((tmp_path / "cache").glob("llm/*"))  # no LLM stage started
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("out, expected", [  # a read-only one: tests/test_bad_input.py
    (lambda tmp: str(PACKAGE_ROOT), "is the project folder"),
    (lambda tmp: str(tmp / "there.jsonl"), "is a file; expected a folder"),
], ids=["the project", "a file"])
def test_a_bad_report_folder_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, out, expected):
    import mice_exp.report.command as report

    (tmp_path / "there.jsonl").write_text("kept\n")
    monkeypatch.setattr(report, "build_report", lambda *a, **k: pytest.fail("the report was built"))
    code, _, err = cli(monkeypatch, capsys, ["report", "--out", out(tmp_path),
                                             "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    assert code == 2 and expected in one_error_line(err)


def test_sigterm_interrupts_as_ctrl_c_does_unless_someone_else_handles_it():
    """What lets a stopped process run its exit handlers (a vLLM engine's core process is stopped by one)."""
    import signal

    from mice_exp.errors import interrupt_on_sigterm

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        interrupt_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)

        def theirs(signum, frame):  # a host's own handler stays
            pass
        signal.signal(signal.SIGTERM, theirs)
        interrupt_on_sigterm()
        assert signal.getsignal(signal.SIGTERM) is theirs
    finally:
        signal.signal(signal.SIGTERM, before)
