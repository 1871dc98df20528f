"""The errors the CLI turns into exit codes, and how an error is shown in one line.

`ConfigError` (and its subclasses, such as `accel.data.DataError`) is bad input: exit 2.
`NonFiniteLoss` is a run that failed for a reason the user can act on: exit 1, one line; so is
`RankFailed`, another rank of a data-parallel run that failed (its own error) or was killed.
`OSError` (a full disk, a folder that cannot be written) is the environment's: exit 1, one line
naming the path. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from accel.uris import redact

MAX_LINE = 300  # characters of an error kept in a message or a tag


class ConfigError(ValueError):
    """Bad user input: the CLI prints the message as one line and exits 2."""


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or inf; the run ends FAILED and the CLI exits 1."""


class RankFailed(RuntimeError):
    """Another rank of a data-parallel run failed or was killed (its error, or how it ended);
    the run ends FAILED and the CLI exits 1."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message. An error raised in a DataLoader worker comes back
    with the worker's traceback as its message: its own message is then the last line."""
    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    if len(lines) > 1 and lines[0].startswith("Caught ") and "DataLoader worker" in lines[0]:
        return lines[-1].split(": ", 1)[-1]  # "accel.data.DataError: <message>"
    return lines[0]


def one_line(error: BaseException) -> str:
    """The first line of an error, with any password in a URL hidden."""
    return redact(first_line(error))[:MAX_LINE]


def describe_error(error: BaseException) -> str:
    """`TypeName: first line`, as kept in a run's `accel.error` tag."""
    return f"{type(error).__name__}: {one_line(error)}"
