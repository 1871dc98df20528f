"""Optuna's database storage, with every call riding out an outage of its database
(accel.outage): a PostgreSQL restarted under a worker makes the worker wait, not fail.

Optuna wraps an `RDBStorage` in its cache (`_CachedStorage`), which calls the methods below;
the heartbeat thread and `fail_stale_trials` inside `study.optimize` go through them too.
"""

from __future__ import annotations

import functools

from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat

from accel.outage import ride_out
from accel.uris import redact

# Every storage call a study makes: the abstract interface of storages and heartbeats, and the
# RDB storage's own methods that Optuna's cache calls directly (reading all trials, among them).
CACHE_CALLS = ("_create_new_trial", "_get_best_trial_id", "_get_trials", "_set_trial_param")
CALLS = sorted({name for base in (BaseStorage, BaseHeartbeat) for name, value in vars(base).items()
                if callable(value) and not name.startswith("__")} | set(CACHE_CALLS))


def _riding(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return ride_out(lambda: method(self, *args, **kwargs), key=self.accel_url,
                        store=f"the Optuna storage {redact(self.accel_url)}")

    return call


class RidingRDBStorage(RDBStorage):
    """`RDBStorage(url, ...)` whose calls wait out an outage of the database; `accel_url` is the
    storage as the user gave it (the outage's key and the name shown)."""

    def __init__(self, url: str, *args, accel_url: str, **kwargs):
        self.accel_url = accel_url
        super().__init__(url, *args, **kwargs)


for _name in CALLS:
    if hasattr(RDBStorage, _name):
        setattr(RidingRDBStorage, _name, _riding(getattr(RDBStorage, _name)))
