"""Stopping cleanly: Ctrl-C (SIGINT) and SIGTERM (`docker stop`, Slurm, Kubernetes preemption)
both raise KeyboardInterrupt once, wherever the work is; later ones are ignored, so that the
clean-up (runs ended KILLED, trials FAIL) can finish. The exit code names the signal."""

from __future__ import annotations

import contextlib
import signal
import sys

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []
# What a stop left behind, for the command's last line (`left_behind`). Process-wide because the
# KeyboardInterrupt that carries a stop up to `accel.cli.main` has no room for it.
_left: list[str] = []


def _stop_once(signum, frame) -> None:
    _received.append(signum)
    ignore_stops()
    raise KeyboardInterrupt


def handle_stops() -> dict:
    """From now on the first SIGINT or SIGTERM raises KeyboardInterrupt. Returns the previous
    handlers, for `restore`."""
    _received.clear()
    _left.clear()
    sys.unraisablehook = _redeliver
    return {s: signal.signal(s, _stop_once) for s in STOP_SIGNALS}


def _redeliver(unraisable) -> None:
    """A stop raised inside a callback Python cannot raise from (a weakref callback or a
    `__del__` run by the garbage collector) would be printed as "Exception ignored" and lost:
    deliver it again, to the next line of ordinary code."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received:
        import os
        import threading

        for s in STOP_SIGNALS:
            signal.signal(s, _stop_once)
        # From another thread: raised here, inside the hook, it would be lost again.
        threading.Timer(0.01, _resend, (os.getpid(), _received.pop())).start()
        return
    sys.__unraisablehook__(unraisable)


def _resend(pid: int, signum: int) -> None:
    """Send the lost stop again, unless it has been acted on meanwhile (the handler is no
    longer ours: clean-up ignores stops, or the command has ended and restored the previous
    handler, where a second signal would kill the process after its own clean exit)."""
    import os

    if signal.getsignal(signum) is _stop_once:
        os.kill(pid, signum)


def stop_requested() -> bool:
    """A stop signal arrived. Code that turns exceptions into other ones (torch.save turns a
    KeyboardInterrupt raised inside it into a RuntimeError) must not lose the stop: callers
    check this before treating an error as a failure."""
    return bool(_received)


def _swallow(signum, frame) -> None:
    """A handler that does nothing. Not SIG_IGN: a signal already pending when the handler
    changes would then raise "OSError: Signal ... ignored due to race condition" (CPython)."""


def ignore_stops() -> None:
    """While clean-up runs: a second Ctrl-C or SIGTERM must not interrupt it."""
    for s in STOP_SIGNALS:
        signal.signal(s, _swallow)
    if signal.getsignal(signal.SIGHUP) is _stop_once:
        signal.signal(signal.SIGHUP, _swallow)


def stop_on_hangup():
    """SIGHUP (the terminal closing) stops as SIGINT and SIGTERM do, for a command whose work is
    a server in the foreground; returns the previous handler, for `signal.signal`."""
    return signal.signal(signal.SIGHUP, _stop_once)


def _record(signum, frame) -> None:
    _received.append(signum)


@contextlib.contextmanager
def deferred_stops():
    """A step that completes or does not start (a study's set-up: study, parent run, first
    trials): a stop that arrives inside it raises KeyboardInterrupt once the step is done, and
    later ones are ignored, as with `handle_stops`. Code inside that only waits checks
    `stop_requested()` and raises KeyboardInterrupt itself."""
    before = len(_received)
    previous = {s: signal.signal(s, _record) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        if len(_received) == before:
            restore(previous)
        else:
            ignore_stops()  # nothing may interrupt the clean-up after the step
            # Raised also in place of an error the step raised: a caller that retries that
            # error (a store write SQLite refused as locked) would otherwise lose the stop,
            # with every later signal ignored.
            raise KeyboardInterrupt


@contextlib.contextmanager
def live_stops():
    """Inside `deferred_stops`: a body that a stop may end anywhere (a trial's training, whose
    own steps defer stops where they must). A stop recorded before it is raised at its start;
    one that arrives inside it raises KeyboardInterrupt there, as with `handle_stops`; after
    it, stops are recorded again until the enclosing step ends."""
    if _received:
        raise KeyboardInterrupt
    previous = {s: signal.signal(s, _stop_once) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        if not _received:  # else `_stop_once` left stops ignored, for the clean-up
            restore(previous)


@contextlib.contextmanager
def atomic():
    """A store write that a stop must not cut in half: SQLite would stay locked for the rest
    of the process, and the clean-up's own writes (runs ended KILLED, trials FAIL) would fail.
    A stop that arrives inside it is raised once the write is done. Where a stop would not be
    raised anyway (clean-up ignores stops; another thread; no accel handler), nothing changes."""
    import threading

    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not _stop_once):
        yield
        return
    with deferred_stops():
        yield


def restore(previous: dict) -> None:
    for s, handler in previous.items():
        signal.signal(s, handler)


def exit_code() -> int:
    """128 + the signal that stopped this process: 130 for Ctrl-C, 143 for SIGTERM."""
    return 128 + (_received[-1] if _received else signal.SIGINT)


def stopped_by() -> str:
    """What stopped this process, for its last line."""
    last = _received[-1] if _received else signal.SIGINT
    return "Ctrl-C" if last == signal.SIGINT else signal.Signals(last).name


def leave_behind(line: str) -> None:
    """Say what a stop left: the run marked KILLED and the command that carries it on. The
    command's last line (`left_behind`) repeats it after the clean-up's own output."""
    _left.append(line)


def left_behind() -> str:
    """'; '-joined lines from `leave_behind`, '' when nothing recorded any."""
    return "; ".join(_left)
