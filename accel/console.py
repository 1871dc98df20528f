"""What accel says on the terminal: notes and warnings on stderr, quiet libraries, numbers in
tables. Results go to stdout; everything about how the work goes goes to stderr."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys

MISSING = "—"  # a cell with no number (not run, failed, not logged)


_held: list[str] | None = None  # notes kept for the end of a study's trials (`notes_held`)


def note(message: str) -> None:
    if _held is not None:
        if message not in _held:
            _held.append(message)
        return
    print(f"accel: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def notes_held():
    """Notes said inside (a study's trials) are said once each when it ends, after the trials'
    progress lines rather than between them."""
    global _held
    outer, _held = _held, []
    try:
        yield
    finally:
        held, _held = _held, outer
        for message in held:
            note(message)


def warn(message: str) -> None:
    print(f"accel: warning: {message}", file=sys.stderr, flush=True)


def progress(message: str) -> None:
    """A progress line of long work (one per trial, run or epoch)."""
    print(message, file=sys.stderr, flush=True)


def program() -> str:
    """`accel` as a new shell can run it, for the commands accel prints: the bare name where
    PATH finds this installation's command, else its path (`.venv/bin/accel` from the project
    folder, before `source .venv/bin/activate`)."""
    import shutil
    from pathlib import Path

    mine = Path(sys.prefix) / "bin" / "accel"
    found = shutil.which("accel")
    if not mine.exists() or (found and Path(found).resolve() == mine.resolve()):
        return "accel"
    try:
        return str(mine.relative_to(Path.cwd()))
    except ValueError:
        return str(mine)


def browser_available() -> bool:
    """A browser can be shown, as `jupyter lab` decides: a graphical session, macOS or Windows, or
    one named in $BROWSER. Over SSH without either, Python's `webbrowser` would start a text
    browser in the terminal the server runs in."""
    return (sys.platform in ("darwin", "win32")
            or any(os.environ.get(name) for name in ("BROWSER", "DISPLAY", "WAYLAND_DISPLAY")))


def open_when_serving(base: str, url: str, wait_s: float = 300.0) -> None:
    """Open `url` in the user's browser once the server at `base` answers, from a background
    thread (the server runs in the foreground); nothing where no browser can be shown."""
    import threading

    if browser_available():
        threading.Thread(target=_open_when_up, args=(base, url, wait_s), daemon=True).start()


def _open_when_up(base: str, url: str, wait_s: float) -> None:
    import time
    import urllib.request
    import webbrowser

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2).close()
        except OSError:  # not up yet
            time.sleep(0.5)
            continue
        if not webbrowser.open(url):
            note(f"no browser found; open {url}")
        return


def quiet_libraries(study: bool = False) -> None:
    """Keep library chatter out of accel's own lines. In a study, Optuna logs every trial
    (failures with tracebacks); `accel tune` prints one line per trial instead."""
    # MLflow sets its own loggers' level when it is imported, from $MLFLOW_LOGGING_LEVEL
    # (default INFO: table creation, system-metrics monitor start and stop, model registration).
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    for name in ("alembic", "mlflow", "optuna"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # per-retry network noise
    # "database is locked" is logged with its traceback before MLflow raises it; accel retries
    # it (tracking.retry_locked) and reports in one line what still fails.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    # Ignite logs every exception that ends a run ("Engine run is terminating due to ...") and a
    # pruned trial as an error; accel reports each in its own line (or with its traceback).
    logging.getLogger("ignite").setLevel(logging.CRITICAL)
    if study:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)


def fmt(value: float | None, digits: int = 4, sign: bool = False) -> str:
    """A table cell: `digits` decimals (with a + sign when asked), MISSING for None or NaN."""
    if value is None or math.isnan(value):
        return MISSING
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"
