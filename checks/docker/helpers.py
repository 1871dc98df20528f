"""The docker check's helpers, pure or nearly so (tests/test_docker.py uses some)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Protocol

from checks.docker.settings import MIRROR, MLFLOW_URL, PROJECT, PYTHON_BASE


class Check(Protocol):
    """What these helpers use of checks.docker.machine's Check (which imports them)."""

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess: ...

    def compose(self, *argv: str, **kwargs) -> subprocess.CompletedProcess: ...


def compose_command() -> list[str]:
    """Compose v2 (`docker compose`) where installed, else v1 (`docker-compose`)."""
    v2 = subprocess.run(["docker", "compose", "version"], capture_output=True)
    return ["docker", "compose"] if v2.returncode == 0 else ["docker-compose"]


def debootstrap_argv(root: Path, packages: list[str]) -> list[str]:
    return ["nice", "-n", "10", "debootstrap", "--variant=minbase",
            "--include=" + ",".join(packages), "bookworm", str(root), MIRROR]


def prune_paths(name: str) -> list[str]:
    """What a stand-in loses before import: apt's caches, and what the official image lacks
    (Debian's pip refuses system installs; Debian's packaging makes a cluster of its own)."""
    common = ["/var/cache/apt/archives", "/var/lib/apt/lists"]
    if name == PYTHON_BASE:
        return [*common, "/usr/lib/python3.11/EXTERNALLY-MANAGED"]
    return [*common, "/var/lib/postgresql/15", "/etc/postgresql/15"]


def read_extra_ca(path: str | None) -> str:
    """PEM text of the extra CA certificates: --extra-ca FILE, else the host's local ones."""
    if path:
        return Path(path).read_text().strip()
    local = sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))
    return "\n".join(p.read_text().strip() for p in local)


def parse_dotenv(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines()
             if "=" in line and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def image_id(name: str) -> str:
    proc = subprocess.run(["docker", "image", "inspect", name, "--format", "{{.Id}}"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def container_ids(check: Check, service: str) -> list[str]:
    out = check.run(["docker", "ps", "-a", "--no-trunc", "-q", "--filter",
                     f"label=com.docker.compose.project={PROJECT}", "--filter",
                     f"label=com.docker.compose.service={service}"]).stdout
    return sorted(out.split())


def health(ids: list[str]) -> str:
    if not ids:
        return ""
    proc = subprocess.run(["docker", "inspect", ids[0], "--format", "{{.State.Health.Status}}"],
                          capture_output=True, text=True)
    return proc.stdout.strip()


def http_code(url: str) -> int | None:
    """The HTTP status a request without a login gets (None: no answer)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def trials_per_minute(runs: list[tuple[float, float]]) -> float:
    """Trials per minute over the span from the first trial's start to the last one's end."""
    if not runs:
        return 0.0
    span = max(end for _, end in runs) - min(start for start, _ in runs)
    return 60.0 * len(runs) / span if span > 0 else 0.0


def client():
    from mlflow.tracking import MlflowClient

    return MlflowClient(MLFLOW_URL)


def study_parents(name: str) -> list:
    c = client()
    ids = [e.experiment_id for e in c.search_experiments()]
    return c.search_runs(ids, f"tags.`accel.role` = 'study' and tags.`accel.study` = '{name}'")


def child_runs(name: str) -> list:
    parents = study_parents(name)
    if not parents:
        return []
    parent = parents[0]
    return client().search_runs([parent.info.experiment_id],
                                f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
                                max_results=1000)


# Optuna's view of a study, read in a worker container (the storage is not published).
TRIALS_CODE = """\
import json, os, sys, optuna
from accel.tune import open_storage
study = optuna.load_study(study_name=sys.argv[1], storage=open_storage(os.environ["ACCEL_STORAGE"]))
print(json.dumps([{"number": t.number, "state": t.state.name, "params": t.params,
                   "failed_trial": t.system_attrs.get("failed_trial")} for t in study.trials]))
"""


def optuna_trials(check: Check, name: str, **env: str) -> list[dict]:
    proc = check.compose("run", "--rm", "--no-deps", "-T", "worker", "python", "-c", TRIALS_CODE,
                         name, **env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def in_worker(check: Check, *argv: str, **env: str) -> subprocess.CompletedProcess:
    return check.compose("run", "--rm", "--no-deps", "-T", "worker", *argv, check=False, **env)

