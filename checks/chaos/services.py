"""Stores of a study's own, started and stopped at will: a PostgreSQL cluster in a scratch folder
on its own port, and an `mlflow server` on its own port. For the chaos check and the tests that
restart them under a running study (tests/test_store_outages.py). Each runs in its own session
and is stopped with its whole process group; nothing outlives `close()`."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from checks.common import free_port


def postgres_bin() -> Path | None:
    """The folder of Debian's PostgreSQL server programs (initdb, pg_ctl), newest first."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


class LocalPostgres:
    """A PostgreSQL cluster of its own (trust auth, 127.0.0.1:`port`), in a scratch folder that
    `close()` removes. As root, the server runs as the `postgres` account (it refuses root)."""

    def __init__(self, port: int | None = None):
        self.bin = postgres_bin()
        if self.bin is None:
            raise RuntimeError("no PostgreSQL server programs (Debian: apt-get install "
                               "postgresql)")
        self.port = port or free_port()
        # Not under a root-only temporary folder: the postgres account must reach it.
        self.folder = Path(tempfile.mkdtemp(prefix="accel-pg-", dir="/tmp"))
        self.folder.chmod(0o755)
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.folder, "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U",
                  "postgres", "--no-sync")

    def _run(self, *argv: str) -> None:
        subprocess.run([*self._as, *argv], check=True, capture_output=True, timeout=120,
                       start_new_session=True)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o",
                  options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """`fast`: open connections are ended (what a restart for maintenance does)."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def kill(self) -> None:
        """SIGKILL the server and every process of it (a crash, the out-of-memory killer): the
        next `start()` recovers from its write-ahead log."""
        import psutil

        pid_file = self.data / "postmaster.pid"
        if not pid_file.exists():
            return
        try:
            server = psutil.Process(int(pid_file.read_text().split()[0]))
            procs = [server, *server.children(recursive=True)]
        except (psutil.NoSuchProcess, ValueError):
            return
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(procs, timeout=30)

    def create_database(self, name: str) -> str:
        import psycopg2

        admin = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres",
                                 dbname="postgres", connect_timeout=5)
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        admin.close()
        return f"{self.url}/{name}"

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)


class MlflowServer:
    """`mlflow server` on 127.0.0.1:`port` over `backend` (a database URI), serving artifacts
    from `folder`/artifacts; `stop()` and `start()` again restart it on the same port and store."""

    def __init__(self, folder: Path, backend: str, port: int | None = None):
        self.folder, self.backend = Path(folder), backend
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout_s: float = 180.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # GenAI jobs: unused, a core each
        self.starts += 1
        log = (self.folder / f"mlflow-{self.starts}.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
             str(self.port), "--backend-store-uri", self.backend, "--artifacts-destination",
             str(self.folder / "artifacts"), "--workers", "1"],
            cwd=self.folder, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}: "
                                   f"{Path(log.name).read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2).close()
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"mlflow server not healthy after {timeout_s:.0f} s")

    def stop(self) -> None:
        """The whole process group (uvicorn and its workers), SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # The port is free once the group is gone (no child left holding it).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
