"""`make slurm-check`: a study as a Slurm job array on a one-node Slurm made here, a task requeued
in the middle of an epoch, then everything stopped and removed.

    sudo .venv/bin/python -m checks.slurm [--trials 8] [--epochs 6] [--keep]

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
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from checks.slurm.cluster import Cluster, install, leftovers
from checks.slurm.settings import PG, log
from checks.slurm.study import run_study


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m checks.slurm",
                                description=__doc__.split("\n")[0])
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
