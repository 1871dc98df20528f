"""Optuna storages: a journal file (one host, many processes; the default) or a database
(`sqlite:///`, `postgresql://`: many hosts), where workers send heartbeats and the trial of a
worker that died is failed and queued again with the same values."""

from __future__ import annotations

import os
import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from accel.errors import ConfigError, one_line
from accel.outage import StoreUnavailable, ride_out
from accel.tracking import tracker_for
from accel.tune.study_record import close_dead_trial
from accel.uris import DEFAULT_STORAGE, redact, sqlite_path, with_driver

__all__ = ["DEFAULT_STORAGE", "RetryStaleTrial", "default_storage", "is_journal",
           "open_storage"]
RDB_SCHEMES = ("sqlite", "postgresql", "mysql")
# RDB storages: a RUNNING trial whose worker sent no heartbeat for GRACE_S seconds is stale (the
# worker died); it is marked FAIL and its params are queued again, at most MAX_RETRY times.
# $ACCEL_HEARTBEAT_S and $ACCEL_GRACE_S override the two (every node of a study should agree).
HEARTBEAT_S, GRACE_S, MAX_RETRY = 30, 120, 2
# A database server's connections are few (PostgreSQL's max_connections is 100 by default) and
# a study across a cluster has many workers: each storage object keeps at most POOL_SIZE open
# connections and opens POOL_OVERFLOW more at a busy moment (SQLAlchemy's defaults, 5 and 10,
# would let one worker hold 15). Two threads use one storage at a time: the trial's and the
# heartbeat's (the study set-up's storage: the command's and the node lease's).
# $ACCEL_DB_POOL_SIZE overrides POOL_SIZE; a thread waits for a free connection, it never fails.
POOL_SIZE, POOL_OVERFLOW = 2, 1
# Nodes that start together on a fresh database all create Optuna's tables at once; the losers
# of that race get a unique-violation error and simply try again.
CREATE_ATTEMPTS = 5


def default_storage() -> str:
    """$ACCEL_STORAGE (a URL with a password stays out of argv), else the journal file."""
    return os.environ.get("ACCEL_STORAGE") or DEFAULT_STORAGE


def heartbeat_s() -> float:
    return float(os.environ.get("ACCEL_HEARTBEAT_S", HEARTBEAT_S))


def grace_s() -> float:
    return float(os.environ.get("ACCEL_GRACE_S", GRACE_S))


def pool_size() -> int:
    return int(os.environ.get("ACCEL_DB_POOL_SIZE", POOL_SIZE))


def is_journal(url: str) -> bool:
    return "://" not in url


def open_storage(url: str, on_stale=None):
    """A journal file (one host, many processes) or an RDB URL (many hosts, heartbeats)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if is_journal(url):
        path = Path(url)
        if path.is_dir():
            raise ConfigError(f"--storage {url}: is a folder; give a journal file path such as "
                              f"{path / 'optuna.journal'}")
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    scheme = url.split("://", 1)[0].split("+", 1)[0]
    if scheme not in RDB_SCHEMES:
        raise ConfigError(f"--storage {redact(url)}: use a journal file path, sqlite:///path.db "
                          "or postgresql://user@host/db")
    db = sqlite_path(url)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    from accel.tune.riding_storage import RidingRDBStorage

    for attempt in range(CREATE_ATTEMPTS):
        try:
            with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna 5
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                # A database this process (or its invocation) reached before is waited for.
                return ride_out(lambda: RidingRDBStorage(
                    with_driver(url), accel_url=url, heartbeat_interval=int(heartbeat_s()),
                    grace_period=int(grace_s()), heartbeat_stale_trial_callback=on_stale,
                    engine_kwargs=_engine_kwargs(scheme),
                ), key=url, store=f"the Optuna storage {redact(url)}")
        except StoreUnavailable:
            raise
        except Exception as e:  # unreachable server, unknown database, missing driver
            if _lost_creation_race(e) and attempt < CREATE_ATTEMPTS - 1:
                time.sleep(0.2 * 2**attempt * (1 + random.random()))
                continue
            raise ConfigError(f"cannot open Optuna storage {redact(url)}: {one_line(e)}") from None
    raise AssertionError("unreachable")


def _engine_kwargs(scheme: str) -> dict:
    # A connection the server closed while a long trial ran is replaced, not used.
    kwargs: dict = {"pool_pre_ping": True}
    if scheme != "sqlite":  # a server's connections are bounded (SQLite has no server)
        kwargs.update(pool_size=pool_size(), max_overflow=POOL_OVERFLOW)
    return kwargs


def _lost_creation_race(error: Exception) -> bool:
    """Another process created the same table or type a moment earlier."""
    from sqlalchemy import exc

    return isinstance(error, exc.IntegrityError | exc.ProgrammingError) and any(
        text in str(error) for text in ("already exists", "UniqueViolation", "duplicate key"))


@dataclass
class RetryStaleTrial:
    """Heartbeat callback: a trial whose worker died is failed in MLflow too and queued again."""

    tracking_uri: str

    def __call__(self, study, trial) -> None:
        import warnings

        from optuna.exceptions import ExperimentalWarning
        from optuna.storages import RetryHeartbeatStaleTrialCallback

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)(study, trial)
        close_dead_trial(tracker_for(self.tracking_uri), study, trial,
                         "its worker stopped sending heartbeats; the trial is queued again",
                         interrupted=False)
