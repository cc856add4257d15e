"""User-facing errors: one clear line, no traceback."""

from __future__ import annotations

import sys
from typing import NoReturn


class UserError(Exception):
    """Bad input from the user (a file, a config key, a value).

    The entrypoint prints ``str(error)`` as a single line and exits with status 2,
    so the message must name what was wrong and what was expected.
    """


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
