"""SIGTERM (docker stop, Slurm, Kubernetes preemption) is handled like Ctrl-C by every command:
the running MLflow run ends KILLED, the running trial FAIL, nothing stays RUNNING, the exit code
is 128 + 15, and the same command carries on."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_OVERRIDES, new_store

SIGTERM_EXIT = 128 + signal.SIGTERM
LONG = [*TINY_OVERRIDES, "train.epochs=200", "tracking.log_checkpoint=false"]


def start(*args: str, cwd: Path = ROOT) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ACCEL_"))}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen([sys.executable, "-m", "accel", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def runs(store: str, experiment: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], max_results=100) if exp else []


def wait_for_epoch(proc: subprocess.Popen, store: str, experiment: str, role: str,
                   epochs: int = 1) -> None:
    """Until a run of `role` has logged `epochs` epochs (the process is then inside train())."""
    from mlflow.tracking import MlflowClient

    deadline = time.time() + 240
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            for run in runs(store, experiment):
                if (run.data.tags.get("accel.role") == role and len(MlflowClient(store)
                        .get_metric_history(run.info.run_id, "val_loss")) >= epochs):
                    return
        except Exception:  # the store is being created
            pass
        time.sleep(0.5)
    raise AssertionError("no epoch was logged in time")


def wait_for_run(proc: subprocess.Popen, store: str, experiment: str) -> None:
    """Until the command's run exists in the store (its first epoch has begun)."""
    deadline = time.time() + 240
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            if runs(store, experiment):
                return
        except Exception:  # the store is being created
            pass
        time.sleep(0.5)
    raise AssertionError("no run was opened in time")


def stop(proc: subprocess.Popen, group: bool = False) -> tuple[int, str]:
    if group:  # Slurm and Kubernetes signal every process of the job
        os.killpg(proc.pid, signal.SIGTERM)
    else:  # docker stop signals the main process only
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_sigterm_ends_a_train_run_killed(tmp_path):
    store = new_store(tmp_path)
    proc = start("train", *LONG, "--tracking-uri", store, "--experiment", "term")
    wait_for_epoch(proc, store, "term", "train")
    code, err = stop(proc)
    assert code == SIGTERM_EXIT, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("accel: stopped by SIGTERM")
    assert "Traceback" not in err
    [run] = runs(store, "term")
    assert run.info.status == "KILLED"
    assert run.data.metrics["val_loss"] > 0  # the finished epochs stay logged


@pytest.mark.parametrize("workers", ["1", pytest.param("2", marks=pytest.mark.slow)])
def test_sigterm_ends_a_study_cleanly_and_the_rerun_resumes(tmp_path, workers):
    store, journal = new_store(tmp_path), str(tmp_path / "optuna.journal")
    tune = ["tune", *LONG, "--study", "term", "--storage", journal, "--tracking-uri", store]
    proc = start(*tune, "--n-trials", "2", "--workers", workers)
    wait_for_epoch(proc, store, "term", "trial")
    code, err = stop(proc, group=workers != "1")
    assert code == SIGTERM_EXIT, err[-3000:]
    assert "Traceback" not in err
    statuses = {r.info.run_name: r.info.status for r in runs(store, "term")}
    assert "RUNNING" not in statuses.values(), statuses
    assert statuses["study-term"] == "KILLED"
    # The last line names the study's parent run and the command that carries the study on.
    [parent] = [r for r in runs(store, "term") if r.data.tags.get("accel.role") == "study"]
    last = err.strip().splitlines()[-1]
    assert f"the study's parent run {parent.info.run_id}" in last, last
    command = last.split("carry the study on with: ", 1)[1].split(" (", 1)[0]
    _, *again = shlex.split(command)
    assert again == [*tune, "--workers", workers, "--n-trials", "2"]
    import optuna

    from accel.tune import open_storage

    study = optuna.load_study(study_name="term", storage=open_storage(journal))
    # The stopped trials are FAIL and queued again with their values (a preemption loses none).
    stopped = [t for t in study.trials if t.state.name == "FAIL"]
    queued = [t for t in study.trials if t.state.name == "WAITING"]
    assert stopped and len(queued) == len(stopped) == len(study.trials) // 2
    assert sorted(t.system_attrs["failed_trial"] for t in queued) == [t.number for t in stopped]
    params = {t.number: t.params for t in stopped}
    assert all(t.params == params[t.system_attrs["failed_trial"]] for t in queued)
    short = [a if a != "train.epochs=200" else "train.epochs=1" for a in tune]
    rerun = subprocess.run([sys.executable, "-m", "accel", *short, "--n-trials", "1"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    study = optuna.load_study(study_name="term", storage=open_storage(journal))
    [done] = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert done.system_attrs["failed_trial"] in {t.number for t in stopped}  # a retry ran first
    assert len([r for r in runs(store, "term") if r.data.tags["accel.role"] == "study"]) == 1


def test_sigterm_ends_an_ablation_killed(tmp_path):
    store = new_store(tmp_path)
    proc = start("ablate", *LONG, "tracking.experiment=term", "--techniques", "ga",
                 "--repeats", "1", "--tracking-uri", store)
    wait_for_epoch(proc, store, "term", "train")
    code, err = stop(proc)
    assert code == SIGTERM_EXIT, err[-2000:]
    statuses = {r.data.tags.get("accel.role"): r.info.status for r in runs(store, "term")}
    assert statuses["ablation"] == "KILLED" and statuses["train"] == "KILLED"
    assert "RUNNING" not in {r.info.status for r in runs(store, "term")}


def logged_epochs(store: str, run_id: str) -> list[int]:
    from mlflow.tracking import MlflowClient

    return sorted(m.step for m in MlflowClient(store).get_metric_history(run_id, "val_loss"))


def test_sigterm_to_train_and_to_resume_then_resume_finishes(tmp_path):
    """Preempted twice: `accel train` stopped by SIGTERM, `accel resume` stopped by SIGTERM
    too, then `accel resume` again: every epoch logged once, the run FINISHED."""
    store = new_store(tmp_path)
    args = [*TINY_OVERRIDES, "train.epochs=12", "train.epoch_length=10"]  # checkpoints on
    proc = start("train", *args, "--tracking-uri", store, "--experiment", "pre")
    wait_for_epoch(proc, store, "pre", "train", epochs=2)
    code, err = stop(proc)
    assert code == SIGTERM_EXIT, err[-2000:]
    [run] = runs(store, "pre")
    first = logged_epochs(store, run.info.run_id)
    assert run.info.status == "KILLED" and 2 <= len(first) < 12
    # The last line names the run and the command that carries it on, as pasted: each resume
    # below runs the command the stop before it printed.
    resume = carry_on_command(err)
    assert resume == ["resume", run.info.run_id, "--tracking-uri", store], err[-500:]

    proc = start(*resume)
    wait_for_epoch(proc, store, "pre", "train", epochs=len(first) + 2)
    code, err = stop(proc)
    assert code == SIGTERM_EXIT and "Traceback" not in err, err[-2000:]
    [run] = runs(store, "pre")
    second = logged_epochs(store, run.info.run_id)
    assert run.info.status == "KILLED" and len(first) < len(second) < 12
    assert carry_on_command(err) == resume

    proc = start(*resume)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    [run] = runs(store, "pre")
    assert run.info.status == "FINISHED"
    assert logged_epochs(store, run.info.run_id) == list(range(1, 13))


def carry_on_command(err: str) -> list[str]:
    """The command a stopped command's last line says to run next, without the program
    (`accel`, or `.venv/bin/accel` where PATH does not find it):
    '... run ID was marked KILLED; carry it on with: accel resume ID ...'."""
    last = err.strip().splitlines()[-1]
    assert "carry it on with: " in last, last
    program, *args = shlex.split(last.split("carry it on with: ", 1)[1])
    assert Path(program).name == "accel" and (ROOT / program).exists() or program == "accel"
    return args


def test_a_run_stopped_before_its_first_checkpoint_says_to_start_over(tmp_path):
    store = new_store(tmp_path)
    proc = start("train", *TINY_OVERRIDES, "train.epoch_length=1000000", "--tracking-uri",
                 store, "--experiment", "early")
    wait_for_run(proc, store, "early")
    code, err = stop(proc)
    assert code == SIGTERM_EXIT, err[-2000:]
    [run] = runs(store, "early")
    assert run.info.status == "KILLED"
    assert err.strip().splitlines()[-1] == (
        f"accel: stopped by SIGTERM; run {run.info.run_id} was marked KILLED before its first "
        "checkpoint: run the same command again to start over")


def test_sigterm_ends_a_reproduce_rerun_killed(tmp_path):
    store = new_store(tmp_path)
    proc = start("train", *LONG, "--tracking-uri", store, "--experiment", "rep")
    wait_for_epoch(proc, store, "rep", "train")
    assert stop(proc)[0] == SIGTERM_EXIT
    [original] = runs(store, "rep")
    proc = start("reproduce", original.info.run_id, "--tracking-uri", store)
    wait_for_epoch(proc, store, "rep", "reproduce")
    code, err = stop(proc)
    assert code == SIGTERM_EXIT and "Traceback" not in err, err[-2000:]
    statuses = {r.data.tags.get("accel.role"): r.info.status for r in runs(store, "rep")}
    assert statuses == {"train": "KILLED", "reproduce": "KILLED"}


def _deaf_worker() -> None:
    """A worker stuck in its clean-up: it ignores Ctrl-C and SIGTERM."""
    from accel.signals import ignore_stops

    ignore_stops()
    time.sleep(120)


def test_a_worker_that_does_not_stop_is_killed():
    """The main process waits for stopping workers, then kills what is left: a worker stuck in
    its clean-up must not keep `accel tune` (and, at exit, multiprocessing) waiting forever."""
    import multiprocessing

    from accel.tune.workers import stop_processes

    proc = multiprocessing.get_context("spawn").Process(target=_deaf_worker)
    proc.start()
    time.sleep(3)  # spawned and inside ignore_stops
    started = time.time()
    stop_processes([proc], wait_s=1.0)
    assert not proc.is_alive() and proc.exitcode == -signal.SIGKILL
    assert time.time() - started < 30


LOCKED_WRITE = """
import os, signal, sqlite3
from accel import signals
from accel.tracking.client import retry_locked

signals.handle_stops()
writes = []

def write():
    writes.append(1)
    if len(writes) == 1:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the store is written
        raise sqlite3.OperationalError("database is locked")

try:
    retry_locked(write)
except KeyboardInterrupt:
    print("stopped after", len(writes), "write")
else:
    print("went on after", len(writes), "writes")
"""


def test_a_stop_during_a_write_refused_as_locked_is_not_lost_to_the_retry():
    """SIGTERM inside a store write that SQLite then refuses ('database is locked'): the stop
    is raised, not the error the retry catches. Lost, the command went on with every later
    signal ignored (an evaluation then read on, and a read that blocks never ended)."""
    proc = subprocess.run([sys.executable, "-c", LOCKED_WRITE], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.strip() == "stopped after 1 write", proc.stdout + proc.stderr[-2000:]
