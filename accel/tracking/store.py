"""Reading what a store already holds: opening an existing store, fetching a run, and finding
its artifacts, also in a store copied from another machine (absolute artifact paths)."""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from accel.console import program
from accel.errors import ConfigError, one_line
from accel.tracking.client import Tracker, check_supported, probe_server
from accel.uris import DEFAULT_URI, redact, resolve_uri, sqlite_path

SIBLING_SUFFIX = "-reproduced"
UI_URL = "http://127.0.0.1:5000"  # where `accel ui` serves by default


def check_reachable(uri: str) -> None:
    """A store MLflow cannot use, or a server that does not answer, fails now, in seconds, with
    one redacted line (before a study or a run is made)."""
    check_supported(uri)
    if uri.startswith(("http://", "https://")):
        probe_server(uri)


def open_store(uri: str | None) -> Tracker:
    """A Tracker on an existing store; a missing or unreachable store is a ConfigError."""
    uri = resolve_uri(uri)
    db = sqlite_path(uri)
    # MLflow would silently create an empty database here; say the store is missing instead.
    if db is not None and not db.is_file():
        raise ConfigError(
            f"no MLflow store at {db} (from --tracking-uri {redact(uri)}); "
            "give the sqlite:///path/to/mlflow.db that holds the run"
        )
    check_reachable(uri)
    return Tracker(uri)


def fetch_run(tracker: Tracker, run_id: str):
    from mlflow.exceptions import MlflowException

    try:
        return tracker.client.get_run(run_id)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise ConfigError(
                f"no run '{run_id}' in the MLflow store {redact(tracker.uri)}; "
                "copy the run id from `accel best` or the MLflow UI"
            ) from None
        raise ConfigError(
            f"cannot read run '{run_id}' from {redact(tracker.uri)}: {one_line(e)}"
        ) from None
    except Exception as e:  # a database that refuses the connection, a bad URL, ...
        raise ConfigError(
            f"cannot read the MLflow store {redact(tracker.uri)}: {one_line(e)}"
        ) from None


def local_path(uri: str) -> Path | None:
    """The folder of a `file:` (or plain path) artifact URI; None for remote artifact stores."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    return None


def local_artifact_dir(tracker: Tracker, run, experiment) -> tuple[Path | None, str | None]:
    """The run's artifact folder on this disk, if its artifacts are local files.

    Returns (folder or None, a note). The logged location is an absolute path; where a copied
    store no longer finds it, the same layout under this store's own artifact root is tried
    (`sqlite:///X/mlflow.db` keeps artifacts in `X/artifacts/<experiment>/<run>/artifacts`).
    """
    logged = local_path(run.info.artifact_uri)
    if logged is None:
        return None, None  # a server or object store: artifacts are downloaded instead
    if logged.is_dir():
        return logged, None
    root = local_path(experiment.artifact_location)
    if tracker.artifact_root and root is not None:
        try:
            relative = logged.relative_to(root.parent)
        except ValueError:
            relative = None
        if relative is not None:
            moved = local_path(tracker.artifact_root) / relative
            if moved.is_dir():
                return moved, (
                    f"artifacts not at the logged {logged}; using the copy beside "
                    f"this store, {moved}"
                )
    return None, f"the run's artifacts are not on this machine (logged at {logged})"


def rerun_experiment(experiment) -> tuple[str, str | None]:
    """Where reruns are logged, and a note when that is not the original's experiment.

    MLflow fixes a run's artifact folder from its experiment's absolute location. In a store
    copied from another machine that folder does not exist here (and may not be creatable), so
    reruns would write outside the store or fail; they go to a sibling experiment of this store.
    """
    location = local_path(experiment.artifact_location)
    if location is None or location.is_dir():
        return experiment.name, None
    sibling = experiment.name + SIBLING_SUFFIX
    return sibling, (
        f"experiment {experiment.name!r} keeps artifacts in {location}, which is "
        f"not on this machine; reruns are logged to experiment {sibling!r}"
    )


def read_artifact(tracker: Tracker, run, local_dir: Path | None, name: str) -> str | None:
    """The text of artifact `name`, or None where it does not exist or cannot be fetched."""
    if local_path(run.info.artifact_uri) is not None:
        path = local_dir / name if local_dir else None
        return path.read_text() if path and path.is_file() else None
    with tempfile.TemporaryDirectory(prefix="accel-") as tmp:
        try:
            return Path(tracker.client.download_artifacts(run.info.run_id, name, tmp)).read_text()
        except Exception:  # missing artifact, or the artifact store is unreachable
            return None


def runs_page(base_url: str, experiment_id: str) -> str:
    """The experiment's runs table in MLflow 3's UI (the model-training view, nested runs)."""
    return (f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs"
            "?workflowType=machine_learning")


def ui_pages(tracker: Tracker, base_url: str) -> tuple[str, list[tuple[str, str]]]:
    """(the page to open first, (name, runs page) of the 10 experiments updated last). First:
    the newest experiment's runs; with none, the experiments list in the model-training view
    (MLflow 3 shows its GenAI view unless the link says otherwise)."""
    found = tracker.client.search_experiments(order_by=["last_update_time DESC"], max_results=10)
    pages = [(e.name, runs_page(base_url, e.experiment_id)) for e in found if e.name != "Default"]
    first = pages[0][1] if pages else (f"{base_url.rstrip('/')}/#/experiments"
                                       "?workflowType=machine_learning")
    return first, pages


def browse_hint(uri: str, experiment_id: str) -> str:
    """Where a person sees the experiment: the tracking server's own page, or `accel ui` on a
    local store and then the page it serves."""
    if uri.startswith(("http://", "https://")):
        parts = urlparse(uri)
        return runs_page(parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl(),
                         experiment_id)
    command = f"{program()} ui" + (f" --tracking-uri {shlex.quote(redact(uri))}"
                            if uri != DEFAULT_URI else "")
    return f"{command}, then open {runs_page(UI_URL, experiment_id)}"
