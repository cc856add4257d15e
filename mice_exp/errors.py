"""User-facing errors: one clear line, no traceback."""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass
from typing import NoReturn


class UserError(Exception):
    """Bad input from the user (a file, a config key, a value).

    The entrypoint prints ``str(error)`` as a single line and exits with status 2,
    so the message must name what was wrong and what was expected.
    """


class Terminated(BaseException):
    """SIGTERM reached a job inside :func:`mice_exp.tracking.run.tracked_run`; raised by its handler so the run ends
    at once, its MLflow run marked with ``status``. The entrypoint prints it as one line (exit status 143).

    A BaseException, like KeyboardInterrupt, so no ``except Exception`` on the way swallows it.
    ``status`` is KILLED (scancel, kill) or FAILED (Slurm's time limit: it sends SIGTERM then too).
    """

    def __init__(self, status: str, why: str):
        super().__init__(why)
        self.status = status


def expect(condition: bool, message: str) -> None:
    """Raise :class:`UserError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise UserError(message)


def fail(error: UserError) -> NoReturn:
    """End the process as the entrypoint ends a user error: one line, exit status 2.

    Also for code that runs under Hydra's own handler (a task function, a launcher), which prints a
    traceback for any exception it catches; ``SystemExit`` passes through it.
    """
    print(f"mice-exp: error: {error}", file=sys.stderr)
    sys.exit(2)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def interrupt_on_sigterm() -> None:
    """From now on SIGTERM (``kill``, Slurm, a container's stop) ends this process as Ctrl-C does, through its
    exit handlers, where it would otherwise die at once; a handler someone else installed is left alone, and
    outside the main thread nothing is installed. Why: a vLLM engine's core is a process of its own, stopped by an
    exit handler; killed without them, this process left it running alone (its memory held, its threads
    spinning), and ``mice-exp serve``'s uvicorn re-raises SIGTERM after its graceful shutdown."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


@dataclass(frozen=True)
class JobFailure:
    """A sweep job that ended in a user error: it fails alone, the other jobs run."""

    number: int
    overrides: str
    error: str

    def __str__(self) -> str:
        return f"job #{self.number} ({self.overrides}) failed: {self.error}"


#: This process's sweep jobs that ended in a user error; the entrypoint ends the sweep with their lines.
#: A launcher whose jobs run in other processes adds theirs (:mod:`mice_exp.launcher.hydra_jobs`).
FAILED_JOBS: list[JobFailure] = []
