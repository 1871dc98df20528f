"""`make slurm-check`'s study on the cluster cluster.py starts: submit it as a 2-task
array, requeue a task while its trial is inside an epoch, wait for the array, check the study and
its MLflow runs. Returns the names of the failed checks."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from checks.common import ROOT, wait_for
from checks.slurm.settings import EXPERIMENT, STUDY, log

TASKS = 2


class Connections(threading.Thread):
    """The most connections to one database seen at once (pg_stat_activity every 0.5 s)."""

    def __init__(self, admin, database: str):
        super().__init__(daemon=True)
        self.admin, self.database, self.most = admin, database, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            try:
                with self.admin.cursor() as cur:
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                (self.database,))
                    self.most = max(self.most, cur.fetchone()[0])
            except Exception:
                return


def run_study(cluster, admin, scratch: Path, args) -> list[str]:
    cluster.start_munge()
    cluster.start_slurm()
    log("one-node Slurm up: " + cluster.slurm(["sinfo", "-h", "-o", "%N %c CPUs %t"]).strip())
    storage, backend = cluster.database(admin), cluster.database(admin)
    url = cluster.start_mlflow(backend)
    log(f"mlflow server on {url}; Optuna storage {storage}")
    exp = scratch / "exp.yaml"
    exp.write_text(EXPERIMENT.replace("EPOCHS", str(args.epochs)))
    jobs = scratch / "jobs"
    start = time.time()
    submit = subprocess.run(
        [sys.executable, "-m", "accel", "tune", str(exp), "--study", STUDY, "--n-trials",
         str(args.trials), "--slurm", str(TASKS), "--slurm-cpus", "1", "--slurm-dir", str(jobs),
         "--storage", storage, "--tracking-uri", url],
        cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=600)
    if submit.returncode != 0:
        log(f"accel tune --slurm exited {submit.returncode}: {submit.stderr[-3000:]}")
        return ["submit"]
    job = re.search(r"submitted job array (\d+)", submit.stderr).group(1)
    log(f"submitted job array {job}: {TASKS} tasks, {args.trials} trials")
    connections = Connections(admin, storage.rsplit("/", 1)[1])
    connections.start()
    requeued = requeue_mid_epoch(cluster, job, url, storage, jobs, args.epochs)
    wait_for(lambda: not cluster.slurm(["squeue", "-h", "-j", job], check=False).strip(),
             "the array's end", timeout=1800)
    wall = time.time() - start
    connections.done.set()
    for log_file in sorted(jobs.glob("*.out")):
        log(f"{log_file.name}: " + " | ".join(
            line for line in log_file.read_text().splitlines() if line.startswith("accel")))
    failed = check_study(url, storage, requeued, args.trials, cluster, job)
    log(f"figures: {args.trials} trials over {TASKS} array tasks, wall {wall:.0f} s from "
        f"submission to the array's end; trial {requeued} requeued mid-epoch; at most "
        f"{connections.most} connections to the Optuna database at once")
    return failed + check_time_limit(cluster, url, storage, exp, scratch / "warned")


def check_time_limit(cluster, url: str, storage: str, exp: Path, jobs: Path) -> list[str]:
    """One task with a 2-minute limit and the warning 60 s before it, on a trial longer than
    that: the warning stops accel (the trial FAIL, its run KILLED) and the script requeues the
    task; the requeued task is then cancelled."""
    from mlflow.tracking import MlflowClient

    submit = subprocess.run(
        [sys.executable, "-m", "accel", "tune", str(exp), "train.epochs=200", "--study", "warned",
         "--n-trials", "1", "--slurm", "1", "--slurm-cpus", "1", "--slurm-time", "2",
         "--slurm-warn", "60", "--slurm-dir", str(jobs), "--storage", storage,
         "--tracking-uri", url], cwd=ROOT, env=cluster.env, capture_output=True, text=True,
        timeout=600)
    if submit.returncode != 0:
        log(f"accel tune --slurm (time limit) exited {submit.returncode}: {submit.stderr[-3000:]}")
        return ["submit with a time limit"]
    job = re.search(r"submitted job array (\d+)", submit.stderr).group(1)
    log(f"submitted job array {job}: 1 task, --slurm-time 2 --slurm-warn 60")
    show = wait_for(lambda: (lambda out: out if "Restarts=1" in out and "JobState=PENDING" in out
                             else None)(cluster.slurm(["scontrol", "show", "job", job])),
                    "the task requeued after its warning", timeout=300)
    cluster.slurm(["scancel", job])
    client = MlflowClient(url)
    runs = client.search_runs([client.get_experiment_by_name("warned").experiment_id])
    trial_runs = [r for r in runs if r.data.tags.get("accel.role") == "trial"]
    text = "".join(f.read_text() for f in jobs.glob("*.out"))
    failed = []
    for ok, what in (
            ("Restarts=1" in show, "the warned task requeued itself (scontrol show job)"),
            ("accel: interrupted" in text, "the warning stopped accel (its log)"),
            ([r.info.status for r in trial_runs] == ["KILLED"]
             and trial_runs[0].data.tags.get("optuna.trial_state") == "FAIL",
             "the warned trial's run KILLED, the trial FAIL")):
        log(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failed.append(what)
    return failed


def _trial_in_an_epoch(url: str, epochs: int):
    """(trial number, run id) of a RUNNING trial that has logged an epoch and has more to go."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(url)
    exp = client.get_experiment_by_name(STUDY)
    for run in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING' AND "
                                  "tags.`accel.role` = 'trial'"):
        done = len(client.get_metric_history(run.info.run_id, "val_loss"))
        if 1 <= done <= epochs - 2:
            return int(run.data.tags["optuna.trial_number"]), run.info.run_id
    return None


def requeue_mid_epoch(cluster, job: str, url: str, storage: str, jobs: Path,
                      epochs: int) -> int:
    """`scontrol requeue` the array task running a trial inside its epochs; its number."""
    import optuna

    from accel.tune import open_storage

    number, _ = wait_for(lambda: _trial_in_an_epoch(url, epochs), "a trial inside an epoch",
                         timeout=900)
    study = optuna.load_study(study_name=STUDY, storage=open_storage(storage))
    pid = study.trials[number].user_attrs["accel.pid"]
    [task] = [f.stem.split("-")[1] for f in jobs.glob("task-*.pids")
              if str(pid) in f.read_text().split()]
    log(f"trial {number} is inside an epoch in array task {task} (accel pid {pid}): "
        f"scontrol requeue {job}_{task}")
    cluster.slurm(["scontrol", "requeue", f"{job}_{task}"])
    return number


def check_study(url: str, storage: str, requeued: int, n_trials: int, cluster,
                job: str) -> list[str]:
    import optuna
    from mlflow.tracking import MlflowClient

    from accel.tune import open_storage

    failed: list[str] = []

    def expect(ok: bool, what: str) -> None:
        log(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failed.append(what)

    study = optuna.load_study(study_name=STUDY, storage=open_storage(storage))
    trials = study.trials
    states = [t.state.name for t in trials]
    retries = {n: t for t in trials for n in t.system_attrs.get("retry_history", [])[-1:]}
    client = MlflowClient(url)
    exp = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    trial_runs = [r for r in runs if r.data.tags.get("accel.role") == "trial"]
    log(f"trials: {', '.join(f'{t.number}:{t.state.name}' for t in trials)}")
    expect(states.count("COMPLETE") == n_trials, f"{n_trials} trials COMPLETE "
           f"({states.count('COMPLETE')})")
    expect(trials[requeued].state.name == "FAIL", f"the requeued trial {requeued} FAIL")
    # the requeued task ran only what its first attempt left of its share
    expect(len(trials) - len(retries) == n_trials,
           f"{n_trials} trials and their retries, no more ({len(trials)} trials, "
           f"{len(retries)} retries)")
    for t in (t for t in trials if t.state.name == "FAIL"):
        retry = retries.get(t.number)
        expect(retry is not None and retry.state.name == "COMPLETE"
               and retry.params == t.params, f"trial {t.number} retried with its values")
        run = next((r for r in trial_runs if retry is not None and r.info.run_id
                    == retry.user_attrs.get("mlflow_run_id")), None)
        expect(run is not None and "accel.resumed_from" in run.data.tags,
               f"trial {t.number}'s retry carried on from its checkpoint")
    numbers = [r.data.tags.get("optuna.trial_number") for r in trial_runs]
    expect(sorted(numbers, key=int) == [str(t.number) for t in trials],
           f"one MLflow run per trial ({len(trial_runs)} runs, {len(trials)} trials)")
    expect("RUNNING" not in states and "WAITING" not in states, "nothing RUNNING in Optuna")
    expect(not [r for r in runs if r.info.status == "RUNNING"], "nothing RUNNING in MLflow")
    parents = [r for r in runs if r.data.tags.get("accel.role") == "study"]
    expect(len(parents) == 1 and parents[0].info.status == "FINISHED", "the parent run FINISHED")
    logged = [f.path for f in client.list_artifacts(parents[0].info.run_id, f"slurm/{job}")]
    expect(parents[0].data.tags.get("accel.slurm_job") == job
           and logged == [f"slurm/{job}/submit.sh"], "the batch script logged on the parent run")
    best = subprocess.run([sys.executable, "-m", "accel", "best", "--study", STUDY, "--storage",
                           storage, "--tracking-uri", url], cwd=ROOT, env=cluster.env,
                          capture_output=True, text=True, timeout=300)
    expect(best.returncode == 0 and "best trial" in best.stdout, "accel best answers")
    return failed
