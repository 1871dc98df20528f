"""A server that `accel ui` or `accel dashboard` runs in the foreground, in its own process
group, stopped whole by any stop of accel: Ctrl-C, SIGTERM, or SIGHUP (its terminal closing).

The server runs in a group of its own because it spawns its own processes (`mlflow ui` starts
uvicorn, which starts its workers): a signal to accel alone, or to accel's group, would not
reach them all, and each must go with the command that started it. Stopping the whole group
leaves no process behind and frees the port."""

from __future__ import annotations

import os
import signal
import subprocess
import time

GRACE_S = 10.0  # a server's time to close after SIGTERM, before SIGKILL


def run_group(cmd: list[str], env: dict[str, str], grace_s: float = GRACE_S) -> int:
    """Run `cmd` in a new session (its own process group) until it exits or accel is stopped;
    either way, no process of that group outlives this call. Returns the server's exit code."""
    from accel import signals

    # SIGINT and SIGTERM raise KeyboardInterrupt (signals.handle_stops); SIGHUP, the terminal
    # closing, would otherwise end accel at once and orphan the server.
    previous = signals.stop_on_hangup()
    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            return proc.wait()
        finally:
            signals.ignore_stops()  # the group's shutdown must finish
            stop_group(proc, grace_s)
    finally:
        signal.signal(signal.SIGHUP, previous)


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to every process of `proc`'s group, SIGKILL to those left after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        if not _signal_group(proc.pid, sig):
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not group_alive(proc.pid):
                return
            time.sleep(0.1)
    proc.poll()


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:  # the group is gone already
        return False


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` still runs (a zombie that no one has reaped yet has
    ended: it holds no port and runs no code)."""
    if not os.path.isdir("/proc"):  # macOS: the group exists while any member, zombie or not
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # state, ppid, pgrp
            return True
    return False
