"""The check's state and its dealings with docker: the daemon, the base images or their
stand-ins, the image, docker/.env, compose, the studies and the killed worker."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from checks.common import ROOT, free_port
from checks.docker.helpers import (
    child_runs,
    compose_command,
    container_ids,
    debootstrap_argv,
    health,
    http_code,
    http_ok,
    image_id,
    optuna_trials,
    parse_dotenv,
    prune_paths,
    read_extra_ca,
)
from checks.docker.settings import (
    COMPOSE,
    DOCKER,
    ENV_FILE,
    IMAGE,
    MLFLOW_URL,
    OVERRIDE,
    PASSWORDS,
    POSTGRES_BASE,
    PROJECT,
    PYTHON_BASE,
    STANDINS,
    log,
)


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

