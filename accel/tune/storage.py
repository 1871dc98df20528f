"""Optuna storages: a journal file (one host, many processes; the default) or a database
(`sqlite:///`, `postgresql://`: many hosts), where workers send heartbeats and the trial of a
worker that died is failed and queued again with the same values."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accel.errors import ConfigError, one_line
from accel.tracking import tracker_for
from accel.tune.tracking import close_trial_run
from accel.uris import DEFAULT_STORAGE, redact, sqlite_path

__all__ = ["DEFAULT_STORAGE", "RetryStaleTrial", "is_journal", "open_storage"]
RDB_SCHEMES = ("sqlite", "postgresql", "mysql")
# RDB storages: a RUNNING trial whose worker sent no heartbeat for GRACE_S seconds is stale (the
# worker died); it is marked FAIL and its params are queued again, at most MAX_RETRY times.
HEARTBEAT_S, GRACE_S, MAX_RETRY = 30, 120, 2


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
    try:
        return optuna.storages.RDBStorage(_with_driver(url), heartbeat_interval=HEARTBEAT_S,
                                          grace_period=GRACE_S,
                                          heartbeat_stale_trial_callback=on_stale)
    except Exception as e:  # unreachable server, unknown database, missing driver
        raise ConfigError(f"cannot open Optuna storage {redact(url)}: {one_line(e)}") from None


def _with_driver(url: str) -> str:
    """SQLAlchemy 2.1 reads `postgresql://` as psycopg 3; use psycopg2 where only it is there."""
    import importlib.util

    if (url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None
            and importlib.util.find_spec("psycopg2") is not None):
        return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


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
        close_trial_run(tracker_for(self.tracking_uri), study.study_name, trial.number,
                        "FAIL", "worker stopped sending heartbeats; the trial is queued again")
