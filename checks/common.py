"""What the system checks share: the repository's root, a free port, a bounded wait, and a
stamped log line. Imports no other module of checks/ (every check package may import it)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition: Callable[[], object], what: str, proc: subprocess.Popen | None = None,
             timeout: float = 60) -> object:
    """`condition()`'s first true answer, asked every 0.5 s (an exception counts as no); a
    RuntimeError when `proc` ends first or `timeout` s pass."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process ended ({proc.returncode}) first")
        with contextlib.suppress(Exception):
            answer = condition()
            if answer:
                return answer
        time.sleep(0.5)
    raise RuntimeError(f"no {what} within {timeout:.0f} s")


def stamped(check: str) -> Callable[[str], None]:
    """The check's log: `[check HH:MM:SS] message`, flushed at once (a killed check keeps it)."""

    def log(msg: str) -> None:
        print(f"[{check} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    return log
