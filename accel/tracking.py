"""MLflow: runs, params, per-epoch metrics, tags, artifacts and the environment of a run.

Everything goes through an explicit `MlflowClient` and run ids (no fluent "active run" state),
so several runs, or several worker processes, never mix up whose metrics are whose.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from accel.config import ConfigError

DEFAULT_URI = "sqlite:///mlruns/mlflow.db"
PACKAGES = ("torch", "torchvision", "pytorch-ignite", "timm", "mlflow", "optuna",
            "optuna-integration", "scikit-learn", "numpy", "pyyaml", "accel")
MAX_PARAM_CHARS = 6000  # MLflow's limit on one param value


def resolve_uri(uri: str | None = None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def redact(uri: str) -> str:
    """The URI with any password replaced, for messages and logs."""
    return re.sub(r"(://[^:/@]+:)[^@]+@", r"\1***@", uri)


def _sqlite_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):])
    return None


class Tracker:
    """A thin layer over `MlflowClient` that speaks the project's contract (names, statuses)."""

    def __init__(self, uri: str | None = None):
        from mlflow.tracking import MlflowClient

        self.uri = resolve_uri(uri)
        db = _sqlite_path(self.uri)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
            # Artifacts sit beside the database: sqlite:///mlruns/mlflow.db -> mlruns/artifacts.
            self.artifact_root: str | None = (db.parent.resolve() / "artifacts").as_uri()
        elif "://" not in self.uri and not self.uri.startswith("file:"):
            raise ConfigError(
                f"--tracking-uri {redact(self.uri)!r} is not a supported store: use "
                "sqlite:///path.db, postgresql://..., or http(s)://host:port"
            )
        else:
            self.artifact_root = None  # a server or database decides where artifacts go
        self.client = MlflowClient(tracking_uri=self.uri)

    def experiment_id(self, name: str) -> str:
        """The experiment called `name`, created if missing (safe when two processes race)."""
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            location = f"{self.artifact_root}/{name}" if self.artifact_root else None
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def start_run(
        self,
        experiment: str,
        run_name: str,
        tags: dict[str, str] | None = None,
        parent_run_id: str | None = None,
    ) -> str:
        tags = dict(tags or {})
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name, tags=tags)
        return run.info.run_id

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(run_id, params=items[i : i + 100], synchronous=True)

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

    def log_figure(self, run_id: str, figure, artifact_file: str) -> None:
        self.client.log_figure(run_id, figure, artifact_file)

    def end_run(self, run_id: str, status: str) -> None:
        """status: FINISHED, FAILED or KILLED."""
        self.client.set_terminated(run_id, status=status)


def _param_value(value: Any) -> str:
    text = "null" if value is None else str(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."


def git_state(cwd: str | Path | None = None) -> dict[str, Any]:
    """The commit of the checkout the code runs from, and whether it has uncommitted changes."""
    cwd = cwd or Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return {"git_commit": None, "git_dirty": None}
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=10,
        )
        return {"git_commit": commit.stdout.strip(), "git_dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"git_commit": None, "git_dirty": None}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str, seed: int) -> dict[str, Any]:
    """What a rerun needs to know about where this run ran (logged as environment.json)."""
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    cuda = torch.cuda.is_available()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "device": device,
        "seed": seed,
        "packages": versions,
        **git_state(),
    }


def write_json(obj: Any, directory: str | Path, name: str) -> Path:
    path = Path(directory) / name
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    return path


def scratch_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="accel-")
