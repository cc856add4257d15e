"""A process pool whose workers each own one device for their whole life.

Worker ``i`` is a spawned (never forked) process born with ``CUDA_VISIBLE_DEVICES=devices[i]``,
so CUDA, whenever a job first touches it, sees only that device; a worker that runs several jobs
keeps its device for all of them. The parent never imports torch or touches CUDA.

Each worker talks to the parent over its own pipe and runs one job at a time, so the parent always
knows which job a worker holds:

* a job that raises (or calls ``sys.exit``) fails alone; the worker goes on with the next job;
* a worker that dies (segfault, OOM kill, ``os._exit``) fails only the job it held; a new worker
  with the same device takes its place for the jobs still waiting.

Results come back in the order of the items. The callable and the results travel with
cloudpickle (as joblib's loky does), so a task function defined in ``__main__`` works.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import time
import traceback
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterator, Sequence

try:
    import cloudpickle
except ImportError:  # pragma: no cover - joblib (a dependency of scikit-learn) vendors it
    from joblib.externals import cloudpickle

from mice_exp.devices import ENV_VAR, describe_exit

log = logging.getLogger(__name__)

MAX_IDLE_RESTARTS = 2  # a worker that keeps dying before it holds a job is not restarted again


class WorkerDied(RuntimeError):
    """The worker process running a job ended before sending its result."""


@dataclass
class Outcome:
    """What happened to one item: ``value`` if ``error`` is None."""

    value: Any = None
    error: BaseException | None = None
    device: str = ""
    pid: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def add_traceback_note(error: BaseException, where: str = "worker") -> None:
    """Keep an exception's traceback across the process boundary (pickling drops ``__traceback__``)."""
    if isinstance(error, Exception) and error.__traceback__ is not None and hasattr(error, "add_note"):
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        error.add_note(f"--- in the {where} process (pid {os.getpid()}, {ENV_VAR}="
                       f"{os.environ.get(ENV_VAR, '<unset>')!r}) ---\n{text.rstrip()}")


def _dumps_checked(status: str, value: Any) -> bytes:
    """Pickle a result, or, where it cannot cross the process boundary, an error saying so."""
    try:
        data = cloudpickle.dumps((status, value))
        pickle.loads(data)  # e.g. an exception class whose __init__ takes other arguments
        return data
    except Exception as error:  # noqa: BLE001
        what = "result" if status == "ok" else "error"
        message = f"the job's {what} could not be sent back from the worker ({error!r}): {value!r:.2000}"
        return cloudpickle.dumps(("error", RuntimeError(message)))


def _run_one(fn_blob: bytes, item: Any) -> bytes:
    try:
        fn = pickle.loads(fn_blob)  # a fresh copy per job: no state leaks from one job to the next
        return _dumps_checked("ok", fn(item))
    except (Exception, SystemExit) as error:  # the job fails alone; KeyboardInterrupt ends the worker
        add_traceback_note(error)
        return _dumps_checked("error", error)


def _worker_main(device: str, env_var: str, fn_blob: bytes, conn: Connection) -> None:
    os.environ[env_var] = device  # already inherited at birth; set again before anything can use CUDA
    try:
        while True:
            try:
                message = conn.recv_bytes()
            except EOFError:  # the parent went away
                return
            task = pickle.loads(message)
            if task is None:
                return
            _index, item = task
            conn.send_bytes(_run_one(fn_blob, item))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent cleans up
        return


@contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


class _Slot:
    """One worker place: a fixed device, and the process currently filling it."""

    def __init__(self, number: int, device: str) -> None:
        self.number = number
        self.device = device
        self.proc: Any = None
        self.conn: Connection | None = None
        self.job: int | None = None
        self.idle_deaths = 0

    def label(self) -> str:
        return f"worker {self.number} (pid {self.proc.pid if self.proc else '-'}, {ENV_VAR}={self.device!r})"


def run_on_devices(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    devices: Sequence[str],
    *,
    env_var: str = ENV_VAR,
    shutdown_grace_s: float = 10.0,
) -> list[Outcome]:
    """``fn(item)`` for every item, in ``len(devices)`` spawned workers, worker ``i`` on ``devices[i]``.

    Returns one ``Outcome`` per item, in order. Never raises for a job's failure.
    """
    if not devices:
        raise ValueError("run_on_devices needs at least one device ('' for a CPU worker)")
    if not items:
        return []
    ctx = multiprocessing.get_context("spawn")
    fn_blob = cloudpickle.dumps(fn)
    outcomes: list[Outcome | None] = [None] * len(items)
    todo: deque[int] = deque(range(len(items)))
    slots = [_Slot(i, d) for i, d in enumerate(devices[: len(items)])]

    def start(slot: _Slot) -> None:
        parent_end, child_end = ctx.Pipe(duplex=True)
        # Spawned children inherit os.environ as it is at start(): the device is set from birth,
        # before the child imports anything (including the parent's __main__ module).
        with _environ(env_var, slot.device):
            proc = ctx.Process(target=_worker_main, args=(slot.device, env_var, fn_blob, child_end),
                               name=f"mice-exp-worker-{slot.number}")
            proc.start()
        child_end.close()
        slot.proc, slot.conn, slot.job = proc, parent_end, None
        log.debug("started %s", slot.label())

    def dispatch(slot: _Slot) -> None:
        assert slot.conn is not None
        task = None
        if todo:
            slot.job = todo.popleft()
            task = (slot.job, items[slot.job])
        try:
            slot.conn.send_bytes(cloudpickle.dumps(task))
        except (BrokenPipeError, ConnectionResetError, EOFError):  # died already: its sentinel says so
            if slot.job is not None:
                todo.appendleft(slot.job)
                slot.job = None

    def receive(slot: _Slot) -> bool:
        assert slot.conn is not None
        try:
            data = slot.conn.recv_bytes()
        except (EOFError, OSError):
            return False
        if slot.job is None:  # nothing was asked of it
            return True
        try:
            status, value = pickle.loads(data)
        except Exception as error:  # noqa: BLE001
            status, value = "error", RuntimeError(f"could not read the job's result: {error!r}")
        pid = slot.proc.pid if slot.proc else None
        outcomes[slot.job] = (Outcome(value=value, device=slot.device, pid=pid) if status == "ok"
                              else Outcome(error=value, device=slot.device, pid=pid))
        slot.job = None
        return True

    def bury(slot: _Slot) -> None:
        """The slot's process has ended: collect a last result, fail its job, maybe replace it."""
        assert slot.proc is not None and slot.conn is not None
        while slot.job is not None and slot.conn.poll() and receive(slot):
            pass
        slot.proc.join()
        code, pid = slot.proc.exitcode, slot.proc.pid
        if slot.job is not None:
            log.error("%s died with %s while running job %d", slot.label(), describe_exit(code), slot.job)
            outcomes[slot.job] = Outcome(
                error=WorkerDied(f"the worker process (pid {pid}, {env_var}={slot.device!r}) died with "
                                 f"{describe_exit(code)} while running this job"),
                device=slot.device, pid=pid)
            slot.job = None
        elif todo:
            slot.idle_deaths += 1
            log.error("%s ended with %s before taking a job", slot.label(), describe_exit(code))
        slot.conn.close()
        slot.proc.close()
        slot.proc = slot.conn = None
        if todo and slot.idle_deaths <= MAX_IDLE_RESTARTS:
            start(slot)  # same device: the replacement owns the GPU its predecessor had
            dispatch(slot)

    try:
        for slot in slots:
            start(slot)
        for slot in slots:
            dispatch(slot)
        while True:
            live = [s for s in slots if s.proc is not None]
            if not live:
                break
            # a busy worker's pipe (its result) or any worker's sentinel (it ended)
            ready = set(wait([s.conn for s in live if s.job is not None] + [s.proc.sentinel for s in live]))
            for slot in live:
                if slot.conn in ready and slot.job is not None and receive(slot):
                    dispatch(slot)
                if slot.proc.sentinel in ready:
                    bury(slot)
    finally:
        _shutdown(slots, shutdown_grace_s)

    for index, outcome in enumerate(outcomes):
        if outcome is None:  # every worker place gave up before this job ran
            outcomes[index] = Outcome(error=WorkerDied(
                "no worker process could be started to run this job (see the errors above)"))
    return outcomes  # type: ignore[return-value]


def _shutdown(slots: Sequence[_Slot], grace_s: float) -> None:
    """End any worker still running (only after an error or Ctrl-C in the parent)."""
    live = [s for s in slots if s.proc is not None]
    for slot in live:  # an idle worker exits on EOF; a busy one gets the grace period to finish up
        slot.conn.close()
    deadline = time.monotonic() + grace_s
    for slot in live:
        slot.proc.join(max(0.0, deadline - time.monotonic()))
    for slot in live:
        if slot.proc.is_alive():
            log.warning("terminating %s", slot.label())
            slot.proc.terminate()
            slot.proc.join(5)
        if slot.proc.is_alive():
            slot.proc.kill()
            slot.proc.join()
        slot.proc.close()
        slot.proc = slot.conn = None
