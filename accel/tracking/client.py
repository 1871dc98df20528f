"""`Tracker`: MLflow runs, params, metrics, tags and artifacts through one explicit client.

Everything goes through an `MlflowClient` and run ids (no fluent "active run" state), so several
runs, or several worker processes, never mix up whose metrics are whose.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import time
from pathlib import Path
from typing import Any

from accel import signals
from accel.config import Config, param_text
from accel.errors import ConfigError
from accel.outage import Riding, ride_out
from accel.uris import redact, resolve_uri, sqlite_path, with_driver

MAX_PARAM_CHARS = 6000  # MLflow's limit on one param value
PARAMS_PER_BATCH = 100  # MLflow takes at most 100 params per log_batch
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
_jitter = random.Random()  # its own stream: a retry must not move the training's random state


class Tracker:
    """A thin layer over `MlflowClient` that speaks the project's contract (names, statuses)."""

    def __init__(self, uri: str | None = None):
        from mlflow.tracking import MlflowClient

        self.uri = resolve_uri(uri)
        check_supported(self.uri)
        db = sqlite_path(self.uri)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
            # Artifacts sit beside the database: sqlite:///mlruns/mlflow.db -> mlruns/artifacts.
            self.artifact_root: str | None = (db.parent.resolve() / "artifacts").as_uri()
        else:
            self.artifact_root = None  # a server or database decides where artifacts go
        if self.uri.startswith(("http://", "https://")):
            short_http_retries()
            probe_server(self.uri)
        # Every call waits out an outage of a store this process reached (accel.outage).
        self.client = Riding(MlflowClient(tracking_uri=with_driver(self.uri)), key=self.uri,
                             store=store_name(self.uri))

    def experiment_id(self, name: str) -> str:
        """The experiment called `name`, created if missing (safe when two processes race)."""
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            location = f"{self.artifact_root}/{name}" if self.artifact_root else None
            # MLflow 3's UI opens a "model training" experiment on its runs table, not on the
            # GenAI overview page.
            return self.client.create_experiment(name, artifact_location=location,
                                                 tags={EXPERIMENT_KIND: MODEL_TRAINING})
        except Exception:
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def start_run(self, experiment: str, run_name: str, tags: dict[str, str] | None = None,
                  parent_run_id: str | None = None) -> str:
        tags = dict(tags or {})
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name, tags=tags)
        return run.info.run_id

    def log_config(self, run_id: str, cfg: Config, extra: dict[str, Any] | None = None) -> None:
        """The one way every kind of run logs its config: the whole config as params (plus
        `extra`, derived values) and as `config.yaml`. Where the run is stored is not part of
        its recipe, and a store URL may hold a password: `tracking.uri` is logged as null."""
        import dataclasses

        logged = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, uri=None))
        self.log_params(run_id, {**logged.flat(), **(extra or {})})
        self.log_text(run_id, logged.to_yaml(), "config.yaml")

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=items[i : i + PARAMS_PER_BATCH],
                                  synchronous=True)

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(run_id, metrics=items, synchronous=True)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items()]
        self.client.log_batch(run_id, tags=items, synchronous=True)

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def log_json(self, run_id: str, obj: Any, artifact_file: str) -> None:
        self.log_text(run_id, json.dumps(obj, indent=2, sort_keys=True, default=str),
                      artifact_file)

    def log_figure(self, run_id: str, figure, artifact_file: str) -> None:
        self.client.log_figure(run_id, figure, artifact_file)

    def end_run(self, run_id: str, status: str) -> None:
        """status: FINISHED, FAILED or KILLED."""
        self.client.set_terminated(run_id, status=status)


def check_supported(uri: str) -> None:
    """A store MLflow 3 writes to, or one clear line. A `file:` URI or a plain folder is MLflow's
    file store, which MLflow 3 refuses with a traceback ("maintenance mode")."""
    if uri.startswith("file:") or "://" not in uri:
        raise ConfigError(
            f"--tracking-uri {redact(uri)!r} is not a supported store (MLflow 3 no longer writes "
            "to file stores): use sqlite:///path.db, postgresql://..., or http(s)://host:port; "
            "`mlflow migrate-filestore` converts a file store"
        )


PROBE_TIMEOUT_S = 10.0
_answered: set[tuple] = set()  # (server, login) pairs that let this process in


def probe_server(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail fast, in one line: MLflow's own client retries a dead server for minutes, and a
    server with a login answers a missing or wrong password only when a run is already made."""
    login = (uri, os.environ.get("MLFLOW_TRACKING_USERNAME"),
             os.environ.get("MLFLOW_TRACKING_PASSWORD"), os.environ.get("MLFLOW_TRACKING_TOKEN"))
    if login in _answered:
        return
    import urllib.error
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlparse(uri)
    bare = parts._replace(netloc=parts.netloc.rpartition("@")[2])  # /health needs no login

    def health() -> None:
        # An HTTPError is an answer, even if not 200: the server is reachable.
        with contextlib.suppress(urllib.error.HTTPError):
            urllib.request.urlopen(f"{bare.geturl().rstrip('/')}/health",
                                   timeout=timeout_s).close()

    try:  # a server this process reached before (a worker's) is waited for; a new one is not
        ride_out(health, key=uri, store=store_name(uri))
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(f"cannot reach the MLflow server at {redact(uri)}: {reason}") from None
    _check_login(uri, timeout_s)
    _answered.add(login)


def store_name(uri: str) -> str:
    """How a line names the store: the server, or the database behind the URI."""
    if uri.startswith(("http://", "https://")):
        return f"the MLflow server at {redact(uri)}"
    return f"the MLflow store {redact(uri)}"


def short_http_retries() -> None:
    """MLflow's client retries a request that found no server for about four minutes (7 tries,
    backoff factor 2); accel waits for a store itself (accel.outage), with a line that says so
    and a window of its own, so each request is tried 3 times within seconds. Settings in the
    environment win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")


def _check_login(uri: str, timeout_s: float) -> None:
    """One read through MLflow's own client code (its credentials: MLFLOW_TRACKING_USERNAME and
    _PASSWORD, a token, a credentials file, TLS settings), not retried."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    creds = get_default_host_creds(uri)
    try:
        response = http_request(creds, "/api/2.0/mlflow/experiments/search", "GET",
                                params={"max_results": 1}, max_retries=0, timeout=timeout_s,
                                raise_on_status=False)
    except Exception as e:  # a timeout, a TLS failure: the server is not usable from here
        raise ConfigError(f"cannot read from the MLflow server at {redact(uri)}: "
                          f"{redact(str(e).splitlines()[0] if str(e) else type(e).__name__)}"
                          ) from None
    if response.status_code == 401:
        given = creds.token or (creds.username and creds.password)
        raise ConfigError(login_refused(uri, creds.username if given else None))
    if response.status_code == 403:
        raise ConfigError(f"the MLflow server at {redact(uri)} lets {creds.username!r} in but "
                          "not read its experiments: ask its admin for READ")


def login_refused(uri: str, username: str | None) -> str:
    """The line for a 401: no login given (username None), or one the server refused."""
    if not username:
        return (f"the MLflow server at {redact(uri)} asks for a login: set "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in the environment")
    return (f"the MLflow server at {redact(uri)} refused the credentials of {username!r} "
            "(MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD): a wrong password or no such "
            "account; its admin makes accounts (docs/scale-out.md)")


def store_refusal(error: BaseException, uri: str) -> str | None:
    """The line for an MLflow server's refusal met after the probe (a read-only account asked
    to log), or None for any other error."""
    code = getattr(error, "error_code", None)
    if code == "UNAUTHENTICATED":
        given = any(os.environ.get(f"MLFLOW_TRACKING_{v}") for v in ("PASSWORD", "TOKEN"))
        return login_refused(uri, os.environ.get("MLFLOW_TRACKING_USERNAME") if given else None)
    if code == "PERMISSION_DENIED":
        user = os.environ.get("MLFLOW_TRACKING_USERNAME") or "this account"
        asked = re.search(r"endpoint (\S+)", str(error))
        what = f" ({asked.group(1)})" if asked else ""
        return (f"the MLflow server at {redact(uri)} does not let {user!r} write here{what}: "
                "runs are logged by an account with EDIT; ask its admin (docs/scale-out.md)")
    return None


def _param_value(value: Any) -> str:
    text = param_text(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."


@functools.cache
def tracker_for(uri: str) -> Tracker:
    """One Tracker (one SQLAlchemy engine) per store and process."""
    return Tracker(uri)


def retry_locked(fn, *args, attempts: int = 8, **kwargs):
    """Call `fn`, backing off while SQLite says 'database is locked' (several worker processes
    write to one MLflow store; its 20 s busy timeout does not cover lock upgrades)."""
    for i in range(attempts):
        try:
            with signals.atomic():  # a stop waits for the write to end (SQLite stays usable)
                return fn(*args, **kwargs)
        except Exception as e:
            if "database is locked" not in str(e) or i == attempts - 1:
                raise
            time.sleep(0.1 * 2**i * (1 + _jitter.random()))
    raise AssertionError("unreachable")


def scratch_dir():
    """A temporary folder for files on their way to MLflow (removed on exit)."""
    import tempfile

    return tempfile.TemporaryDirectory(prefix="accel-")
