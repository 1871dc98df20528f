"""One step of the check: its own process group, its own timeout, its log, its row.

A step that times out is ended (SIGTERM, then SIGKILL) and still summarised: the measuring steps
print each result as soon as it exists, so a timed-out step's row keeps what it had measured.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from checks.common import ROOT

GRACE_S = 10  # SIGTERM, then this long before SIGKILL: accel marks its MLflow run KILLED


@dataclass
class Summary:
    ok: bool
    numbers: str  # the key numbers, one table cell
    section: str = ""  # markdown for the report's own part on this step


@dataclass
class Step:
    name: str  # also its log's name: letters, digits, '_'
    argv: list[str]
    timeout: float
    summarize: Callable[[str, dict], Summary]  # (its log, the env) -> what it showed
    skip: str = ""  # why this machine does not run it (a "skipped" row), or "" to run it
    title: str = ""  # the report's heading for its section ("" = no section)


@dataclass
class Row:
    step: str
    command: str
    status: str  # "ok", "FAILED" or "skipped"
    seconds: float
    numbers: str
    tail: list[str] = field(default_factory=list)  # a failed step's last output lines
    section: str = ""
    title: str = ""


def run_step(step: Step, env: dict, out: Path, deadline: float) -> Row:
    """Run one step into OUT/<name>.log; a failure or a timeout is a FAILED row, never a skip."""
    command = shown(step.argv, env)
    timeout = min(step.timeout, deadline - time.monotonic() - GRACE_S)
    log = out / f"{step.name}.log"
    if step.skip:
        log.write_text(f"{step.skip}\n")
        return Row(step.name, command, "skipped", 0.0, step.skip, title=step.title)
    if timeout < 5:
        log.write_text("not started: the check's time budget was spent\n")
        return Row(step.name, command, "FAILED", 0.0, "not started: no time left",
                   title=step.title)
    started = time.monotonic()
    code = execute(step.argv, env, log, timeout)
    seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    try:
        summary = step.summarize(text, env)
    except Exception as e:  # an output the parser does not know is a failed check too
        summary = Summary(False, f"could not read its output: {e!r}")
    if code is None:
        summary.ok, summary.numbers = False, f"timed out after {timeout:.0f} s; {summary.numbers}"
    elif code != 0:
        summary.ok, summary.numbers = False, f"exit {code}; {summary.numbers}"
    status = "ok" if summary.ok else "FAILED"
    tail = [] if summary.ok else text.rstrip().splitlines()[-15:]
    return Row(step.name, command, status, seconds, summary.numbers, tail, summary.section,
               step.title)


def execute(argv: list[str], env: dict, log: Path, timeout: float) -> int | None:
    """The exit code, or None when it ran past `timeout` (its whole process group is ended)."""
    with log.open("w") as f:
        f.write(f"$ {shown(argv, env)}\n")
        f.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own group: a timeout ends it all
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            f.write(f"\n[gpu_check: timed out after {timeout:.0f} s; its process group ended]\n")
            return None


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the step's process group (accel ends its run KILLED), SIGKILL what outlives it."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def shown(argv: list[str], env: dict) -> str:
    """The command as a reader would type it: python3, and $WORK for the scratch folder."""
    text = shlex.join(["python3" if argv[0] == sys.executable else argv[0], *argv[1:]])
    return text.replace(env["ACCEL_WORK"], "$WORK")
