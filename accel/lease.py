"""A trial's lease: the worker process that runs a trial holds it while the study's storage says
the trial is RUNNING. A worker frozen past the heartbeat grace period (a long GC pause, a
swapped-out process, a VM frozen for a live migration) comes back to a trial that another worker
has meanwhile failed as stale and queued again: the next heartbeat finds so and revokes the
lease, and the training stops at its next update (`check`), leaving the trial's record as the
storage and the retry have it (accel.tune.one_trial holds the lease and watches it).

One trial at a time in a process, so one lease; a process that holds none (a lone run, an
ablation) never loses one."""

from __future__ import annotations

import threading
from collections.abc import Callable

_lost = threading.Event()
_why = [""]
_verify: list[Callable[[], str | None] | None] = [None]


class LeaseLost(Exception):
    """The trial is no longer this process's: it was failed (and queued again) meanwhile."""


def hold(verify: Callable[[], str | None]) -> None:
    """This process runs a trial from now on; `verify()` asks the storage whether it still does
    (None) or why not."""
    _lost.clear()
    _verify[0] = verify


def release() -> None:
    _verify[0] = None
    _lost.clear()


def revoke(why: str) -> None:
    """Called by the heartbeat that found the trial no longer RUNNING."""
    _why[0] = why
    _lost.set()


def check() -> None:
    """Between updates: raises `LeaseLost` once a heartbeat revoked the lease. A flag read: no
    store call, no device sync."""
    if _lost.is_set():
        raise LeaseLost(_why[0])


def confirm() -> None:
    """Before a write made once per trial (its MLflow run opened, its outcome recorded): ask the
    storage now, since the heartbeat may not have run since this process came back."""
    verify = _verify[0]
    if verify is not None and not _lost.is_set():
        why = verify()
        if why:
            revoke(why)
    check()
