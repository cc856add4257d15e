"""User-facing errors: one clear line, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (a file, a config key, a value).

    The entrypoint prints ``str(error)`` as a single line and exits with status 2,
    so the message must name what was wrong and what was expected.
    """


def expect(condition: bool, message: str) -> None:
    """Raise :class:`UserError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise UserError(message)
