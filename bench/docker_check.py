"""`make docker-check`: the docker/ stack built and run, checked from the host, then removed.

    .venv/bin/python bench/docker_check.py [--trials 6] [--rebuild] [--extra-ca FILE]

1. A docker daemon: the running one, else `dockerd` started here (its own process group, stopped
   at the end with everything it started).
2. Base images: `python:3.11-slim` and `postgres:17` are used when present; where no registry can
   be reached, stand-ins are made from Debian bookworm's packages (debootstrap) and tagged with
   those names, so docker/compose.yaml is used unchanged. The postgres stand-in's entrypoint is
   docker/standin/postgres-entrypoint.sh (POSTGRES_USER/PASSWORD/DB, /docker-entrypoint-initdb.d,
   pg_isready).
3. The image: `docker build -f docker/Dockerfile -t accel:cpu --network host`, with the host's
   extra CA certificates (/usr/local/share/ca-certificates/*.crt, or --extra-ca) as EXTRA_CA_CERT.
4. The stack (project `accel`, credentials from docker/.env; made from .env.example with random
   passwords when absent and removed again): db + mlflow (its login refuses an anonymous
   request), the workers' account, then three studies on the quickstart:
   1 worker, 2 workers (`--scale worker=2`), 2 workers with one container killed mid-trial.
   From the host, through the MLflow server on 127.0.0.1:5000: one parent run, one child run per
   trial, artifacts served as `mlflow-artifacts:`; in a worker container: `accel best --register`
   and `accel reproduce` of the best trial (exact), the killed worker's trial FAIL and retried
   with the same values by the other worker.
5. `down -v`: no container, network or volume of the project left; the table; exit 1 on any
   failed check.

Workers run with one torch thread, heartbeat 2 s and grace 10 s (a compose override made here),
so that a killed worker's trial is retried within the study.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
ENV_FILE = DOCKER / ".env"
PROJECT = "accel"
IMAGE = "accel:cpu"
PYTHON_BASE, POSTGRES_BASE = "python:3.11-slim", "postgres:17"
MLFLOW_URL = "http://127.0.0.1:5000"
# docker/.env's passwords, made at random where the check makes docker/.env.
PASSWORDS = ("POSTGRES_PASSWORD", "ACCEL_ADMIN_PASSWORD", "ACCEL_WORKER_PASSWORD")
MIRROR = "http://deb.debian.org/debian"
PG_BIN = "/usr/lib/postgresql/15/bin"  # bookworm's PostgreSQL
# What each stand-in holds, and the image settings `docker import` gives it (what the official
# image's Dockerfile would have set).
STANDINS = {
    PYTHON_BASE: {
        "packages": ["python3", "python3-venv", "python3-pip", "python-is-python3",
                     "ca-certificates"],
        "changes": ["ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "ENV LANG=C.UTF-8", 'CMD ["python3"]'],
    },
    POSTGRES_BASE: {
        "packages": ["postgresql", "postgresql-client", "ca-certificates"],
        "changes": [f"ENV PATH={PG_BIN}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "ENV LANG=C.UTF-8", "ENV PGDATA=/var/lib/postgresql/data",
                    'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]', "EXPOSE 5432"],
    },
}
# The check's own settings for the services (a second compose file; compose.yaml is unchanged).
OVERRIDE = """\
x-check: &check
  environment:
    OMP_NUM_THREADS: "1"
    ACCEL_HEARTBEAT_S: "2"
    ACCEL_GRACE_S: "10"
services:
  study: *check
  worker: *check
"""


def log(msg: str) -> None:
    print(f"[docker-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Check:
    """The run's state: what it started (to stop), its results (the table) and failed checks."""

    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        self.daemon: subprocess.Popen | None = None
        self.made_env = False
        self.passwords: list[str] = []
        # The stack publishes PostgreSQL on this host; 5432 is often the host's own PostgreSQL.
        self.db_port = str(free_port())
        self.rows: list[tuple[str, str]] = []
        self.failed: list[str] = []
        self.compose_cmd = compose_command()
        self.override = work / "check.override.yaml"
        self.override.write_text(OVERRIDE)

    # --- bookkeeping -------------------------------------------------------------------------

    def expect(self, ok: bool, what: str, detail: str = "") -> bool:
        log(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {self.redact(detail)}" if detail and not ok
                                                      else ""))
        if not ok:
            self.failed.append(what)
        return ok

    def redact(self, text: str) -> str:
        for password in self.passwords:
            text = text.replace(password, "***")
        return text

    def run(self, argv: list[str], *, env: dict | None = None, timeout: float = 1800,
            check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:4])} ... exited {proc.returncode}:\n"
                               + self.redact((proc.stdout + proc.stderr)[-3000:]))
        if not quiet and proc.returncode != 0:
            log(self.redact((proc.stdout + proc.stderr)[-2000:]))
        return proc

    # --- the daemon ------------------------------------------------------------------------

    def ensure_daemon(self) -> None:
        if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
            log("using the running docker daemon")
            return
        log("starting dockerd (its own process group)")
        out = (self.work / "dockerd.log").open("w")
        self.daemon = subprocess.Popen(["dockerd"], stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        deadline = time.time() + 60
        while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
            if self.daemon.poll() is not None or time.time() > deadline:
                raise RuntimeError("dockerd did not start: see " + str(self.work / "dockerd.log"))
            time.sleep(1)

    def stop_daemon(self) -> None:
        if self.daemon is None:
            return
        log("stopping the dockerd started here")
        os.killpg(self.daemon.pid, signal.SIGTERM)
        try:
            self.daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.daemon.pid, signal.SIGKILL)
            self.daemon.wait()
        # containerd and shims it started leave with the group; make sure of it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.daemon.pid, signal.SIGKILL)

    # --- images ------------------------------------------------------------------------------

    def has_image(self, name: str) -> bool:
        return subprocess.run(["docker", "image", "inspect", name],
                              capture_output=True).returncode == 0

    def base_images(self) -> None:
        for name in (PYTHON_BASE, POSTGRES_BASE):
            if self.has_image(name):
                log(f"base image {name}: present")
                continue
            if self.run(["docker", "pull", name], check=False, quiet=True).returncode == 0:
                log(f"base image {name}: pulled")
                continue
            start = time.perf_counter()
            self.make_standin(name)
            log(f"base image {name}: stand-in made from Debian packages in "
                f"{time.perf_counter() - start:.0f} s")

    def make_standin(self, name: str) -> None:
        spec = STANDINS[name]
        root = self.work / ("rootfs-" + name.split(":")[0])
        self.run(debootstrap_argv(root, spec["packages"]), timeout=1800)
        for path in prune_paths(name):
            target = root / path.lstrip("/")
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        if name == POSTGRES_BASE:
            entry = root / "usr/local/bin/docker-entrypoint.sh"
            shutil.copy(DOCKER / "standin" / "postgres-entrypoint.sh", entry)
            entry.chmod(0o755)
            (root / "docker-entrypoint-initdb.d").mkdir(exist_ok=True)
            data = root / "var/lib/postgresql/data"
            data.mkdir(parents=True, exist_ok=True)
            ids = [int(self.run(["chroot", str(root), "id", flag, "postgres"]).stdout)
                   for flag in ("-u", "-g")]
            os.chown(data, *ids)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        argv = ["docker", "import"]
        for change in spec["changes"]:
            argv += ["-c", change]
        imported = subprocess.run([*argv, "-", name], stdin=tar.stdout, capture_output=True,
                                  text=True)
        tar.wait()
        if imported.returncode != 0:
            raise RuntimeError(f"docker import {name}: {imported.stderr.strip()}")
        shutil.rmtree(root)

    def build(self) -> None:
        old = image_id(IMAGE)
        argv = ["docker", "build", "--network", "host", "-f", str(DOCKER / "Dockerfile"),
                "-t", IMAGE, "--build-arg", f"BASE_IMAGE={PYTHON_BASE}"]
        extra_ca = read_extra_ca(self.args.extra_ca)
        if extra_ca:
            argv += ["--build-arg", f"EXTRA_CA_CERT={extra_ca}"]
        if self.args.rebuild:
            argv.append("--no-cache")
        log(f"building {IMAGE} (extra CA: {'yes' if extra_ca else 'no'}"
            f"{', no cache' if self.args.rebuild else ''})")
        start = time.perf_counter()
        # The classic builder: no BuildKit cache is left beside the image's own layers.
        self.run([*argv, str(ROOT)], env={**os.environ, "DOCKER_BUILDKIT": "0"}, timeout=3600)
        seconds = time.perf_counter() - start
        new = image_id(IMAGE)
        if old and old != new:  # the image this build replaced, now untagged
            self.run(["docker", "image", "rm", old], check=False, quiet=True)
        size = int(self.run(["docker", "image", "inspect", IMAGE, "--format",
                             "{{.Size}}"]).stdout)
        cached = "cache reused" if seconds < 60 and not self.args.rebuild else "first build"
        self.rows.append(("image accel:cpu size", f"{size / 1e9:.2f} GB"))
        self.rows.append(("image build time", f"{seconds:.0f} s ({cached})"))

    # --- the stack ---------------------------------------------------------------------------

    def dotenv(self) -> None:
        if not ENV_FILE.exists():
            text = (DOCKER / ".env.example").read_text()
            for name in PASSWORDS:
                text = text.replace(f"{name}=\n", f"{name}={secrets.token_urlsafe(18)}\n")
            ENV_FILE.write_text(text)
            ENV_FILE.chmod(0o600)
            self.made_env = True
            log("docker/.env made from .env.example with random passwords (removed at the end)")
        values = parse_dotenv(ENV_FILE.read_text())
        self.passwords = [values.get(name, "") for name in PASSWORDS]
        missing = [name for name in PASSWORDS if not values.get(name)]
        if missing:
            raise RuntimeError(f"docker/.env has no {', '.join(missing)}: set them")
        # The host's checks read the server as its admin (MLflow's client: by environment).
        os.environ["MLFLOW_TRACKING_USERNAME"] = values.get("ACCEL_ADMIN_USERNAME") or "admin"
        os.environ["MLFLOW_TRACKING_PASSWORD"] = values["ACCEL_ADMIN_PASSWORD"]

    def compose(self, *args: str, timeout: float = 900, check: bool = True,
                **env: str) -> subprocess.CompletedProcess:
        environ = {**os.environ, "BASE_IMAGE": PYTHON_BASE, "ACCEL_IMAGE_TAG": "cpu",
                   "COMPOSE_PROJECT_NAME": PROJECT, "ACCEL_DB_PORT": self.db_port, **env}
        environ.pop("EXTRA_CA_CERT", None)
        argv = [*self.compose_cmd, "-p", PROJECT, "-f", str(COMPOSE), "-f", str(self.override),
                *args]
        return self.run(argv, env=environ, timeout=timeout, check=check)

    def start_stack(self) -> None:
        start = time.perf_counter()
        self.compose("up", "-d", "--no-build", "db", "mlflow")
        deadline = time.time() + 300
        while health(container_ids(self, "mlflow")) != "healthy":
            if time.time() > deadline:
                raise RuntimeError("mlflow not healthy after 300 s:\n" + self.redact(
                    self.compose("logs", "--tail", "40", "db", "mlflow").stdout))
            time.sleep(1)
        seconds = time.perf_counter() - start
        self.expect(http_ok(f"{MLFLOW_URL}/health"), "MLflow server answers on 127.0.0.1:5000")
        self.expect(http_code(f"{MLFLOW_URL}/api/2.0/mlflow/experiments/search?max_results=1")
                    == 401, "MLflow server refuses a request without a login (401)")
        self.rows.append(("stack start-up (db + mlflow healthy)", f"{seconds:.0f} s"))

    def study(self, name: str, workers: int, trials: int, kill: bool = False) -> dict:
        """Runs one study on `workers` worker containers; returns its trials and timings."""
        env = {"ACCEL_STUDY": name, "ACCEL_TRIALS": str(trials),
               "ACCEL_CONFIG": "experiments/quickstart.yaml"}
        start = time.perf_counter()
        self.compose("up", "-d", "--no-build", "--scale", f"worker={workers}", "worker", **env)
        workers_ids = container_ids(self, "worker")
        killed = self.kill_one_mid_trial(name, workers_ids) if kill else None
        codes = [int(self.run(["docker", "wait", cid], timeout=1800).stdout) for cid in workers_ids]
        wall = time.perf_counter() - start
        study_code = int(self.run(["docker", "inspect", container_ids(self, "study")[0],
                                   "--format", "{{.State.ExitCode}}"]).stdout)
        self.expect(study_code == 0, f"{name}: the study container created the study")
        want = [137 if cid == killed else 0 for cid in workers_ids]
        if not self.expect(codes == want, f"{name}: {workers} worker(s) exited {want}",
                           f"exit codes {codes}"):
            log(self.redact(self.compose("logs", "--tail", "30", "worker", **env).stdout))
        return {"wall": wall, "trials": optuna_trials(self, name, **env), "killed": killed}

    def kill_one_mid_trial(self, name: str, workers: list[str]) -> str | None:
        """SIGKILL one worker container while every worker is inside a trial (as many RUNNING
        trial runs as workers), so the one killed leaves a trial behind."""
        deadline = time.time() + 600
        while time.time() < deadline:
            running = [r for r in child_runs(name) if r.info.status == "RUNNING"]
            if len(running) < len(workers):
                time.sleep(0.3)
                continue
            victim = workers[0]
            self.run(["docker", "kill", victim])
            log(f"{name}: killed worker container {victim[:12]} inside a trial")
            return victim
        self.expect(False, f"{name}: every worker was seen inside a trial")
        return None


# --- helpers (pure or nearly so; tests/test_docker.py uses some) ----------------------------------


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


# --- the checks --------------------------------------------------------------------------------


def check_runs(check: Check, name: str, trials: list[dict]) -> None:
    parents = study_parents(name)
    if not check.expect(len(parents) == 1, f"{name}: one parent run", f"{len(parents)} found"):
        return
    check.expect(parents[0].info.status == "FINISHED", f"{name}: parent run FINISHED",
                 parents[0].info.status)
    children = child_runs(name)
    numbers = sorted(int(r.data.tags["optuna.trial_number"]) for r in children)
    check.expect(numbers == [t["number"] for t in trials],
                 f"{name}: one child run per trial ({len(trials)})", f"{numbers}")
    uris = [r.info.artifact_uri for r in children]
    check.expect(all(u.startswith("mlflow-artifacts:") for u in uris),
                 f"{name}: artifacts stored as mlflow-artifacts: URIs", f"{uris[:2]}")
    with tempfile.TemporaryDirectory() as tmp:
        path = client().download_artifacts(children[0].info.run_id, "config.yaml", tmp)
        check.expect("accel_cnn_s" in Path(path).read_text(),
                     f"{name}: config.yaml downloaded from the server to the host")


def check_best_and_reproduce(check: Check, name: str) -> None:
    model = f"{name}-best"
    best = in_worker(check, "accel", "best", "--study", name, "--register", model)
    if not check.expect(best.returncode == 0, f"{name}: accel best --register {model}",
                        best.stderr[-1500:]):
        return
    versions = client().search_model_versions(f"name = '{model}'")
    check.expect(len(versions) == 1, f"{name}: model version registered on the server")
    lines = [ln for ln in best.stdout.splitlines() if ln.startswith("reproduce:")]
    if not check.expect(bool(lines), f"{name}: accel best prints the reproduce command",
                        best.stdout[-1000:]):
        return
    argv = lines[0].split()[1:]  # "reproduce: accel reproduce RUN_ID ..."
    rerun = in_worker(check, *argv, OMP_NUM_THREADS="1")
    check.expect(rerun.returncode == 0 and "(exactly)" in rerun.stdout,
                 f"{name}: accel reproduce of the best trial is exact",
                 rerun.stdout[-1000:] + rerun.stderr[-1000:])


def check_retry(check: Check, name: str, trials: list[dict]) -> None:
    failed = [t for t in trials if t["state"] == "FAIL"]
    if not check.expect(len(failed) == 1, f"{name}: the killed worker's trial FAIL",
                        f"{[(t['number'], t['state']) for t in trials]}"):
        return
    dead = failed[0]
    retried = [t for t in trials if t["failed_trial"] == dead["number"]]
    check.expect(len(retried) == 1 and retried[0]["state"] in ("COMPLETE", "PRUNED")
                 and retried[0]["params"] == dead["params"],
                 f"{name}: trial {dead['number']} retried with the same values by the other "
                 "worker", f"{retried}")
    runs = {r.data.tags["optuna.trial_number"]: r for r in child_runs(name)}
    run = runs.get(str(dead["number"]))
    check.expect(run is not None and run.info.status == "FAILED",
                 f"{name}: the dead trial's MLflow run FAILED",
                 run.info.status if run else "no run")
    check.expect(len(runs) == len(trials) and not [r for r in runs.values()
                                                    if r.info.status == "RUNNING"],
                 f"{name}: one run per trial, none left RUNNING")


def throughput(check: Check, name: str, workers: int, result: dict) -> None:
    spans = [(r.info.start_time / 1000, r.info.end_time / 1000) for r in child_runs(name)
             if r.info.end_time]
    rate = trials_per_minute(spans)
    n = len(result["trials"])
    whole = 60.0 * n / result["wall"]
    check.rows.append((f"trials per minute, {workers} worker{'s' * (workers > 1)}",
                       f"{rate:.1f} (first trial start to last end); {whole:.1f} counting "
                       f"container start-up ({n} trials in {result['wall']:.0f} s)"))


def leftovers(check: Check) -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    found = []
    for kind in ("container", "network", "volume"):
        argv = ["docker", kind, "ls", "-q", "--filter", label]
        if kind == "container":
            argv.insert(3, "-a")
        out = check.run(argv).stdout.split()
        found += [f"{kind} {x[:12]}" for x in out]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=6, help="trials per worker (default 6)")
    parser.add_argument("--rebuild", action="store_true", help="build the image without cache")
    parser.add_argument("--extra-ca", help="PEM file of CA certificates for the image build "
                        "(default: /usr/local/share/ca-certificates/*.crt)")
    args = parser.parse_args()
    if not shutil.which("docker"):
        print("docker-check needs docker (apt-get install docker.io docker-compose "
              "debootstrap; root starts dockerd)", file=sys.stderr)
        return 2
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    work = Path(tempfile.mkdtemp(prefix="accel-docker-check-"))
    check = Check(args, work)
    started = time.perf_counter()
    up = False
    try:
        check.ensure_daemon()
        log(f"compose: {' '.join(check.compose_cmd)}; logs in {work}")
        check.dotenv()
        check.base_images()
        check.build()
        up = True
        check.start_stack()
        one = check.study("dc-1worker", 1, args.trials)
        throughput(check, "dc-1worker", 1, one)
        two = check.study("dc-2workers", 2, args.trials)
        throughput(check, "dc-2workers", 2, two)
        check_runs(check, "dc-2workers", two["trials"])
        check_best_and_reproduce(check, "dc-2workers")
        kill = check.study("dc-kill", 2, args.trials + 4, kill=True)
        check_retry(check, "dc-kill", kill["trials"])
    except Exception as exc:  # noqa: BLE001 - reported as a failed check, then cleaned up
        check.expect(False, "the check ran to its end", str(exc))
    finally:
        if up:
            check.compose("down", "-v", "--remove-orphans", check=False)
            left = leftovers(check)
            check.expect(not left, "down -v left no container, network or volume", str(left))
        if check.made_env:
            ENV_FILE.unlink()
        check.stop_daemon()
        if not check.failed:
            shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    print(f"\nmake docker-check: {time.perf_counter() - started:.0f} s in all, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores")
    print("| measure | value |\n| --- | --- |")
    for what, value in check.rows:
        print(f"| {what} | {value} |")
    if check.failed:
        print(f"\n{len(check.failed)} check(s) failed: " + "; ".join(check.failed))
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
