"""Riding out a store that goes away for a while: PostgreSQL restarted for maintenance or failing
over, the MLflow tracking server redeployed.

Every call a worker makes to a store (the MLflow client, the Optuna database storage) goes
through `ride_out`. While the store does not answer, the call is tried again with backoff (0.5 s
doubling to 8 s), with one line when the wait begins and one when the store answers again, for
up to `window_s()` seconds ($ACCEL_OUTAGE_S, 120 by default); past that it raises
`StoreUnavailable`, naming the store: the trial fails, is queued again, and the invocation ends
with exit 1. A store that never answered this process fails at once instead (the one-line
exit 2 at start): only a store that was reached once, here or by the invocation that started
this worker (`mark_reached`), is waited for.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from accel import signals
from accel.console import progress

WINDOW_S = 120.0
FIRST_WAIT_S, MAX_WAIT_S = 0.5, 8.0
# How a store that is not there shows itself, in the text of the error or of one it was raised
# from: a refused or dropped connection (HTTP, PostgreSQL), a server shutting down or starting
# up, a proxy or server in front of a store that is down (502-504 after MLflow's own retries).
OUTAGE_MARKERS = (
    "connection refused", "could not connect to server", "connection to server at",
    "max retries exceeded", "connection reset", "connection aborted", "remote end closed",
    "server closed the connection", "connection already closed", "terminating connection",
    "the database system is shutting down", "the database system is starting up",
    "the database system is in recovery mode", "cannot connect now", "ssl syscall error",
    "broken pipe", "name or service not known", "temporary failure in name resolution",
    "too many 502 error", "too many 503 error", "too many 504 error", "too many 500 error",
    "read timed out", "connect timeout", "timed out",
)
T = TypeVar("T")
_reached: set[str] = set()
_jitter = random.Random()  # its own stream: a wait must not move the training's random state
_lock = threading.Lock()
_waiting: dict[str, float] = {}  # store -> when this process began waiting for it


def window_s() -> float:
    return float(os.environ.get("ACCEL_OUTAGE_S", WINDOW_S))


class StoreUnavailable(RuntimeError):
    """A store that did not answer for the whole outage window: the CLI exits 1, one line."""

    def __init__(self, store: str, seconds: float, error: BaseException):
        from accel.errors import one_line

        self.store = store
        super().__init__(f"{store} did not answer for {seconds:.0f} s "
                         f"($ACCEL_OUTAGE_S={window_s():.0f}): {one_line(error)[:200]}")


def mark_reached(key: str) -> None:
    """`key` (a store URL) answered the invocation that started this process: wait for it."""
    _reached.add(key)


def is_outage(error: BaseException) -> bool:
    """Whether `error`, or one it was raised from, says its store is not there (as opposed to
    a refusal, a bug or bad input, which are raised at once)."""
    return _outage_cause(error) is not None


def _outage_cause(error: BaseException | None) -> BaseException | None:
    """The error in `error`'s chain that says the store is not there (Optuna's says only that a
    commit failed; the one it was raised from says why), or None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, StoreUnavailable):
            return None  # an inner call already waited its window
        seen.add(id(error))
        if isinstance(error, ConnectionError | TimeoutError):
            return error
        text = str(error).lower()
        if any(marker in text for marker in OUTAGE_MARKERS):
            return error
        error = error.__cause__ or error.__context__
    return None


def ride_out(call: Callable[[], T], *, key: str, store: str) -> T:
    """`call()`, waited out while the store `key` (shown as `store`) is away."""
    started, wait = None, FIRST_WAIT_S
    while True:
        try:
            with signals.atomic():  # a stop never lands inside a store's client or driver
                result = call()
        except Exception as e:
            if not is_outage(e) or key not in _reached:
                raise
            if signals.stop_requested():  # a stop (maybe deferred) ends the wait: its
                raise  # clean-up meets the store as it is, the next invocation closes the rest
            now = time.monotonic()
            if started is None:
                started = _begin(key, store, e, now)
            if now - started >= window_s():
                with _lock:
                    _waiting.pop(key, None)
                _reached.discard(key)  # the clean-up that follows does not wait again
                raise StoreUnavailable(store, now - started, e) from e
            time.sleep(min(wait * (1 + 0.25 * _jitter.random()),
                           max(0.05, started + window_s() - now)))
            wait = min(wait * 2, MAX_WAIT_S)
            continue
        _reached.add(key)
        if started is not None:
            _end(key, store)
        return result


def _begin(key: str, store: str, error: BaseException, now: float) -> float:
    """When this process began waiting for the store: one line for all the calls that wait."""
    from accel.errors import one_line

    with _lock:
        if key not in _waiting:
            _waiting[key] = now
            cause = one_line(_outage_cause(error) or error)
            progress(f"accel: {store} does not answer ({cause[:160]}); waiting up to "
                     f"{window_s():.0f} s for it")
        return _waiting[key]


def _end(key: str, store: str) -> None:
    with _lock:
        began = _waiting.pop(key, None)
    if began is not None:
        progress(f"accel: {store} answers again after {time.monotonic() - began:.0f} s")


class Riding:
    """An object whose every method call rides out its store's outages (an MLflow client)."""

    def __init__(self, target: Any, key: str, store: str):
        self._target, self._key, self._store = target, key, store

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            return ride_out(lambda: value(*args, **kwargs), key=self._key, store=self._store)

        return call
