"""The one-node Slurm of `make slurm-check`: Debian's slurm-wlm and munge installed without their
services, munged, slurmctld and slurmd started in a scratch folder (each in its own session),
databases on the host's PostgreSQL, an `mlflow server`; everything stopped at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

from checks.common import free_port, wait_for
from checks.slurm.settings import PG, log


def install() -> None:
    """Debian's slurm-wlm and munge, without starting their services."""
    if all(shutil.which(b) for b in ("slurmctld", "slurmd", "munged", "sbatch")):
        return
    log("installing slurm-wlm and munge (apt-get)")
    policy = Path("/usr/sbin/policy-rc.d")
    made = not policy.exists()
    if made:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                        "slurm-wlm", "munge"], check=True, env=env)
    finally:
        if made:
            policy.unlink()


class Cluster:
    """What the check started, to stop it all at the end."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.daemons: dict[str, subprocess.Popen] = {}
        self.databases: list[str] = []
        self.conf = scratch / "slurm" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "OMP_NUM_THREADS": "1",
                    "ACCEL_HEARTBEAT_S": "2", "ACCEL_GRACE_S": "10"}
        for k in ("MLFLOW_TRACKING_URI", "ACCEL_STORAGE", "MLFLOW_TRACKING_USERNAME",
                  "MLFLOW_TRACKING_PASSWORD"):
            self.env.pop(k, None)

    def daemon(self, name: str, argv: list[str], env: dict | None = None) -> None:
        out = (self.scratch / f"{name}.log").open("w")
        self.daemons[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                              env=env or self.env, start_new_session=True)

    def start_munge(self) -> None:
        d = self.scratch / "munge"
        d.mkdir(mode=0o700)
        subprocess.run(["mungekey", "--create", f"--keyfile={d / 'munge.key'}"], check=True)
        os.chmod(d / "munge.key", 0o400)
        self.socket = d / "munge.socket"
        self.daemon("munged", ["munged", "--foreground", "--force", f"--socket={self.socket}",
                               f"--key-file={d / 'munge.key'}", f"--pid-file={d / 'munged.pid'}",
                               f"--seed-file={d / 'munged.seed'}",
                               f"--log-file={d / 'munged.log'}"])
        wait_for(lambda: self.socket.exists(), "munged's socket", self.daemons["munged"])

    def write_conf(self) -> None:
        d = self.scratch / "slurm"
        for sub in ("ctld", "spool"):
            (d / sub).mkdir(parents=True)
        node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True,
                              check=True).stdout.splitlines()[0]
        host = socket.gethostname().split(".")[0]
        node = node.replace(node.split()[0], f"NodeName={host} NodeAddr=127.0.0.1")
        self.conf.write_text("\n".join([
            "ClusterName=accelcheck", f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={d / 'ctld'}", f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SwitchType=switch/none", "MpiDefault=none", "ReturnToService=2",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU", "JobRequeue=1", "KillWait=30", "MinJobAge=600",
            f"{node} State=UNKNOWN",
            f"PartitionName=check Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""]))

    def start_slurm(self) -> None:
        self.write_conf()
        self.daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self.daemon("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        wait_for(lambda: "idle" in self.slurm(["sinfo", "-h", "-o", "%t"], check=False),
                 "the node idle in sinfo", self.daemons["slurmd"], 90)

    def slurm(self, argv: list[str], check: bool = True) -> str:
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")
        return proc.stdout

    def database(self, admin) -> str:
        name = f"accel_slurm_{uuid.uuid4().hex[:8]}"
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        self.databases.append(name)
        return PG + name

    def start_mlflow(self, backend: str) -> str:
        port = free_port()
        env = {**self.env, "MLFLOW_BACKEND_STORE_URI": backend.replace(
            "postgresql://", "postgresql+psycopg2://"),
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.daemon("mlflow", [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "2", "--artifacts-destination",
                               str(self.scratch / "artifacts")], env)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: urllib.request.urlopen(f"{url}/health", timeout=2).status == 200,
                 "mlflow server", self.daemons["mlflow"], 180)
        return url

    def stop(self, admin) -> None:
        """Jobs, daemons (slurmd before slurmctld, munged last), databases."""
        with contextlib.suppress(Exception):
            if "slurmctld" in self.daemons:
                self.slurm(["scancel", "--full", "-u", "root"], check=False)
                wait_for(lambda: not self.slurm(["squeue", "-h"], check=False).strip(),
                         "the queue empty", timeout=60)
        for name in ("slurmd", "slurmctld", "mlflow", "munged"):
            proc = self.daemons.get(name)
            if proc is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if admin is not None:
            with admin.cursor() as cur:
                for name in self.databases:
                    cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def leftovers(scratch: Path) -> list[str]:
    """Processes of the check still alive: its daemons, its jobs' steps, anything naming the
    scratch folder."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    names = ("slurmctld", "slurmd", "slurmstepd", "munged")
    return [line.strip() for line in out.splitlines()[1:]
            if str(scratch) in line or line.split(None, 1)[-1].split(":")[0].split()[0]
            .rsplit("/", 1)[-1] in names]
