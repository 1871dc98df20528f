"""`make slurm-check`: a study as a Slurm job array on a one-node Slurm made here, a task requeued
in the middle of an epoch, then everything stopped and removed.

    sudo .venv/bin/python bench/slurm_check.py [--trials 8] [--epochs 6] [--keep]

1. As root: installs Debian's `slurm-wlm` and `munge` when missing (services are not started
   by the install: a policy-rc.d refuses them for its duration).
2. A scratch folder (/tmp/accel-slurm-check-*) holds everything: munged with its own key and
   socket, slurm.conf (`ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`, no
   cgroup.conf, the node as `slurmd -C` describes it, free ports), slurmctld and slurmd in the
   foreground, each in its own session; two databases of its own on the PostgreSQL at
   127.0.0.1:5432 (Optuna's and MLflow's) and an `mlflow server` on a free port.
3. `accel tune --slurm 2` submits the study (`--trials` trials, no pruning, one CPU per task,
   heartbeat 2 s, grace 10 s); once a trial has logged an epoch and is inside the next one,
   `scontrol requeue` ends its array task (SIGTERM to every process of the task) and Slurm
   starts it again.
4. When the array has left the queue: every trial COMPLETE, or FAIL and retried with the same
   values from its checkpoint; one MLflow run per trial; nothing RUNNING in Optuna or MLflow;
   the parent run FINISHED; `accel best` answers. The most connections to the Optuna database
   seen at once (pg_stat_activity, sampled every 0.5 s) is printed.
   Then a time limit: one task with `--slurm-time 2 --slurm-warn 60` on a trial longer than
   that: Slurm's warning (SIGUSR1 to the batch shell) stops accel (the trial FAIL, its run
   KILLED) and the script requeues the task (`Restarts=1`), which is then cancelled.
5. Always, even after a failure: the jobs cancelled, slurmd, slurmctld, munged and the server
   stopped (their process groups), the databases dropped, the scratch removed (unless --keep),
   then `ps` shows nothing of it left. Exit 1 if any check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: `bench`

from bench.slurm_common import EXPERIMENT, ROOT, STUDY, log, wait_for  # noqa: E402, F401

PG = "postgresql://postgres@127.0.0.1:5432/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("slurm-check: needs root (it installs packages and runs slurmd as root)",
              file=sys.stderr)
        return 2
    install()
    import psycopg2

    scratch = Path(tempfile.mkdtemp(prefix="accel-slurm-check-"))
    cluster, admin, failed = Cluster(scratch), None, ["not run"]
    try:
        admin = psycopg2.connect(PG + "postgres", connect_timeout=5)
        admin.autocommit = True
        from bench.slurm_study import run_study  # the study and its checks

        failed = run_study(cluster, admin, scratch, args)
    finally:
        cluster.stop(admin)
        if admin is not None:
            admin.close()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        left = leftovers(scratch)
        deadline = time.time() + 30  # a stopped daemon's children may take a moment
        while left and time.time() < deadline:
            time.sleep(1)
            left = leftovers(scratch)
        log("nothing left running" if not left else "LEFT RUNNING: " + "; ".join(left))
        if left:
            failed = [*failed, "processes left running"]
    log("all checks passed" if not failed else "FAILED: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
