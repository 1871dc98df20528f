"""The errors the CLI turns into exit codes, and how an error is shown in one line.

`ConfigError` (and its subclasses, such as `accel.data.DataError`) is bad input: exit 2.
`NonFiniteLoss` is a run that failed for a reason the user can act on: exit 1, one line.
Anything else is a bug or an environment failure and keeps its traceback.
"""

from __future__ import annotations

from accel.uris import redact

MAX_LINE = 300  # characters of an error kept in a message or a tag


class ConfigError(ValueError):
    """Bad user input: the CLI prints the message as one line and exits 2."""


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or inf; the run ends FAILED and the CLI exits 1."""


def one_line(error: BaseException) -> str:
    """The first line of an error, with any password in a URL hidden."""
    text = str(error).strip().splitlines()
    return redact(text[0] if text else type(error).__name__)[:MAX_LINE]


def describe_error(error: BaseException) -> str:
    """`TypeName: first line`, as kept in a run's `accel.error` tag."""
    return f"{type(error).__name__}: {one_line(error)}"
