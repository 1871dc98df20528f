"""`accel tune --slurm N` without Slurm: the batch script it writes, each array task's share of
the trials, the refusals, and a worker warned by the script's signal ending its trial as a stop.
The script runs under bash with Slurm's variables set and a stand-in `scontrol`/`sbatch`;
`make slurm-check` runs the same on a real one-node Slurm."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from accel.tune.slurm import SlurmJob, batch_script, finished_by, read_pids, share
from tests.conftest import ROOT, TINY_OVERRIDES, cli_main, new_store
from tests.test_signals import SIGTERM_EXIT, runs
from tests.test_study_signals import poll


def job(tmp_path: Path, **kw) -> SlurmJob:
    fields = {"study": "s", "tasks": 2, "n_trials": 9, "tune_args": ["exp.yaml", "train.lr=1e-3"],
              "folder": tmp_path / "slurm", "workdir": ROOT}
    return SlurmJob(**{**fields, **kw})


def sbatch_options(script: str) -> list[str]:
    return re.findall(r"^#SBATCH (\S+)$", script, re.M)


def test_the_batch_script_asks_for_an_array_a_warning_and_a_requeue(tmp_path):
    script = batch_script(job(tmp_path, time="2:00:00", partition="gpu", account="lab",
                              gpus=1, cpus=8, warn_s=240, sbatch=["--qos=high", "--mem=32G"]))
    options = sbatch_options(script)
    assert options == [
        "--job-name=accel-s", "--array=0-1", "--requeue", "--signal=B:USR1@240",
        "--open-mode=append", f"--output={tmp_path / 'slurm'}/%x-%A_%a.out",
        f"--chdir={ROOT}", "--time=2:00:00", "--partition=gpu", "--account=lab",
        "--cpus-per-task=8", "--gres=gpu:1", "--qos=high", "--mem=32G"]
    assert "scontrol requeue \"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\"" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # no store in the script: the URLs (and their passwords) go by environment
    assert "postgresql" not in script and "--storage" not in script


def test_options_left_unset_are_left_to_the_cluster(tmp_path):
    options = sbatch_options(batch_script(job(tmp_path)))
    assert not [o for o in options if o.startswith(("--time", "--partition", "--account",
                                                    "--gres", "--cpus-per-task"))]


def fake_python(tmp_path: Path, left: int = 0) -> Path:
    """Stands in for the interpreter the script runs: records `accel tune`'s arguments, and
    answers `accel.tune.slurm left` with `left`."""
    path = tmp_path / "python"
    path.write_text("#!/bin/bash\n"
                    f"if [ \"$2\" = accel.tune.slurm ]; then echo {left}; exit 0; fi\n"
                    f"echo \"$@\" >> {tmp_path / 'calls'}\n")
    path.chmod(0o755)
    return path


def run_task(script: Path, index: int, restart: int = 0, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(index), "SLURM_ARRAY_JOB_ID": "77",
           "SLURM_RESTART_COUNT": str(restart), **env}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize(("n_trials", "tasks"), [(9, 2), (8, 2), (10, 4), (3, 3), (40, 7)])
def test_the_array_tasks_share_the_trials(tmp_path, n_trials, tasks):
    """Each task's `--n-trials`, as the script computes it from SLURM_ARRAY_TASK_ID: they add
    up to the study's trials and differ by at most one."""
    script = tmp_path / "submit.sh"
    script.write_text(batch_script(job(tmp_path, n_trials=n_trials, tasks=tasks,
                                       python=str(fake_python(tmp_path)))))
    (tmp_path / "slurm").mkdir()
    for index in range(tasks):
        assert run_task(script, index).returncode == 0
    calls = (tmp_path / "calls").read_text().splitlines()
    shares = [int(c.split("--n-trials ")[1]) for c in calls]
    assert sum(shares) == n_trials and max(shares) - min(shares) <= 1
    assert shares == [share(n_trials, tasks, i) for i in range(tasks)]
    assert all(c.startswith("-m accel tune exp.yaml train.lr=1e-3 --study s") for c in calls)


def test_a_requeued_task_runs_what_its_earlier_attempts_left(tmp_path):
    script = tmp_path / "submit.sh"
    script.write_text(batch_script(job(tmp_path, python=str(fake_python(tmp_path, left=2)))))
    (tmp_path / "slurm").mkdir()
    assert run_task(script, 0, restart=1).returncode == 0
    assert (tmp_path / "calls").read_text().split("--n-trials ")[1].strip() == "2"
    script.write_text(batch_script(job(tmp_path, python=str(fake_python(tmp_path, left=0)))))
    done = run_task(script, 0, restart=2)
    assert done.returncode == 0 and "0 of 5 trial(s)" in done.stdout
    assert len((tmp_path / "calls").read_text().splitlines()) == 1, "no accel for nothing left"


def test_finished_by_counts_a_tasks_own_trials_that_are_not_retried(tmp_path):
    """Trials of the task's processes (by their node lease's host and pid): COMPLETE, PRUNED
    and FAIL count, a FAIL queued again does not (the retry is the trial), others' do not."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from accel.tune.nodes import ATTR_NODE

    study = optuna.create_study()
    host = socket.gethostname()
    study.set_user_attr(ATTR_NODE + "mine1", {"host": host, "pid": 11, "ended": True})
    study.set_user_attr(ATTR_NODE + "mine2", {"host": host, "pid": 12, "ended": False})
    study.set_user_attr(ATTR_NODE + "other", {"host": host, "pid": 13, "ended": False})
    for invocation, state in [("mine1", TrialState.COMPLETE), ("mine1", TrialState.FAIL),
                              ("mine2", TrialState.PRUNED), ("mine2", TrialState.FAIL),
                              ("other", TrialState.COMPLETE), ("mine2", TrialState.RUNNING)]:
        study.add_trial(create_trial(state=state, value=0.5 if state.is_finished() and
                                     state != TrialState.FAIL else None,
                                     user_attrs={"accel.invocation": invocation}))
    # trial 1 (mine1's FAIL) was queued again as trial 6
    study.add_trial(create_trial(state=TrialState.WAITING,
                                 system_attrs={"failed_trial": 1, "retry_history": [1]}))
    pids = tmp_path / "task-0.pids"
    pids.write_text(f"{host} 11\n{host} 12\n")
    assert read_pids(pids) == {(host, 11), (host, 12)}
    assert finished_by(study, read_pids(pids)) == 3  # trials 0, 2, 3
    assert finished_by(study, set()) == 0


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("storage", "named"), [
    ("mlruns/optuna.journal", "a journal file"), ("sqlite:///study.db", "sqlite://")])
def test_a_study_across_nodes_refuses_a_file_storage(tmp_path, storage, named):
    code, out, err = cli_main("tune", "--slurm", "2", "--storage", storage,
                              "--tracking-uri", "http://127.0.0.1:5999")
    assert code == 2 and not out
    [line] = err.splitlines()
    assert named in line and "postgresql://" in line and "shared filesystem" in line


def test_a_study_across_nodes_refuses_a_local_mlflow_store(tmp_path):
    code, _, err = cli_main("tune", "--slurm", "2", "--storage", "postgresql://u@db/optuna",
                            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db")
    assert code == 2 and len(err.splitlines()) == 1 and "http://host:5000" in err


def test_without_sbatch_it_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch there
    code, _, err = cli_main("tune", "--slurm", "2", "--storage", "postgresql://u@db/optuna",
                            "--tracking-uri", "http://127.0.0.1:5999")
    assert code == 2 and len(err.splitlines()) == 1 and "no `sbatch` on PATH" in err


@pytest.mark.parametrize(("args", "says"), [
    (["--slurm", "0"], "--slurm 0: must be >= 1"),
    (["--slurm", "4", "--n-trials", "3"], "--slurm 4: more array tasks than the 3 trial(s)"),
    (["--slurm", "2", "--slurm-dir", "/tmp/my jobs"], "--slurm-dir /tmp/my jobs: has a space")])
def test_bad_task_counts_are_one_line(tmp_path, monkeypatch, args, says):
    (tmp_path / "sbatch").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    code, _, err = cli_main("tune", *args, "--storage", "postgresql://u@db/optuna",
                            "--tracking-uri", "http://127.0.0.1:5999")
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err


# --- the warning: a real worker under the generated script ------------------------------------


def _trial_in_an_epoch(store: str, study: str):
    from mlflow.tracking import MlflowClient

    for run in runs(store, study):
        if (run.data.tags.get("accel.role") == "trial" and run.info.status == "RUNNING"
                and MlflowClient(store).get_metric_history(run.info.run_id, "val_loss")):
            return run
    return None


class Connections(threading.Thread):
    """The most connections to one database seen at once, until `done` is set."""

    def __init__(self, database: str):
        super().__init__(daemon=True)
        self.database, self.most, self.done = database, 0, threading.Event()

    def run(self) -> None:
        import psycopg2

        # Autocommit, and no `with admin:` (a transaction, even so): a transaction sees one
        # snapshot of pg_stat_activity.
        admin = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
        admin.autocommit = True
        try:
            with admin.cursor() as cur:
                while not self.done.wait(0.1):
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                (self.database,))
                    self.most = max(self.most, cur.fetchone()[0])
        finally:
            admin.close()


def test_a_worker_warned_before_its_time_limit_ends_its_trial_as_a_stop(tmp_path, postgres_url):
    """The script under bash as Slurm runs it (array task 0 of job 77); Slurm's warning,
    SIGUSR1 to the batch shell, reaches accel as SIGTERM: the trial ends FAIL and its run
    KILLED, accel exits 143, and the script requeues its task. Meanwhile the task holds at most
    the connections docs/scale-out.md counts for one worker: 3 x (1 + 1)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'scontrol'}\n")
    (bin_dir / "scontrol").chmod(0o755)
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"search": {"pruner": "none", "space": {
        "train.lr": {"type": "float", "low": 1e-3, "high": 2e-3}}}}))
    script = tmp_path / "submit.sh"
    script.write_text(batch_script(job(tmp_path, study="warned", n_trials=2, tune_args=[
        str(exp), *TINY_OVERRIDES, "train.epochs=200", "tracking.log_checkpoint=false"])))
    (tmp_path / "slurm").mkdir()
    store = new_store(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ACCEL_"))},
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": "0",
           "SLURM_ARRAY_JOB_ID": "77", "SLURM_RESTART_COUNT": "0", "OMP_NUM_THREADS": "1",
           "ACCEL_STORAGE": postgres_url, "MLFLOW_TRACKING_URI": store}
    connections = Connections(postgres_url.rsplit("/", 1)[1])
    connections.start()
    proc = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        run = poll(lambda: _trial_in_an_epoch(store, "warned"), "a trial inside its epochs",
                   proc)
        proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@S sends: the batch shell only
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    connections.done.set()
    connections.join(10)
    assert proc.returncode == SIGTERM_EXIT, err[-3000:]
    assert 1 <= connections.most <= 3 * (1 + 1), connections.most
    assert "accel: interrupted" in err and "Traceback" not in err, err[-3000:]
    assert (tmp_path / "scontrol").read_text().split() == ["requeue", "77_0"]
    by_id = {r.info.run_id: r for r in runs(store, "warned")}
    stopped = by_id[run.info.run_id]
    assert stopped.info.status == "KILLED"
    assert stopped.data.tags["optuna.trial_state"] == "FAIL"
    assert "RUNNING" not in {r.info.status for r in by_id.values()}
    import optuna

    from accel.tune import open_storage

    study = optuna.load_study(study_name="warned", storage=open_storage(postgres_url))
    number = int(stopped.data.tags["optuna.trial_number"])
    assert study.trials[number].state.name == "FAIL"
    assert not [t for t in study.trials if t.state.name == "RUNNING"]
    [(host, pid)] = read_pids(tmp_path / "slurm" / "task-0.pids")
    assert host == socket.gethostname()
    assert study.trials[number].user_attrs["accel.pid"] == pid, "the pid file names accel"


def test_the_script_finds_accel_by_this_interpreter(tmp_path):
    script = batch_script(job(tmp_path))
    assert f"{sys.executable} -m accel tune exp.yaml" in script


def test_each_storage_object_keeps_at_most_three_connections(postgres_url, monkeypatch):
    """2 kept open, 1 more at a busy moment (SQLAlchemy's own 5 + 10 would allow 15); the
    count docs/scale-out.md multiplies out. ACCEL_DB_POOL_SIZE changes the 2."""
    from accel.tune import open_storage

    pool = open_storage(postgres_url).engine.pool
    assert (pool.size(), pool._max_overflow) == (2, 1)
    monkeypatch.setenv("ACCEL_DB_POOL_SIZE", "4")
    assert open_storage(postgres_url).engine.pool.size() == 4
