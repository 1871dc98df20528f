"""SIGTERM (docker stop, Slurm, Kubernetes preemption) is handled like Ctrl-C by every command:
the running MLflow run ends KILLED, the running trial FAIL, nothing stays RUNNING, the exit code
is 128 + 15, and the same command carries on."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT, TINY_OVERRIDES, new_store, run_in_process

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


# Checkpoints on: the run stopped here is resumed below.
RESUMABLE = [*TINY_OVERRIDES, "train.epochs=12", "train.epoch_length=10"]


@pytest.fixture(scope="module")
def stopped_train(tmp_path_factory) -> SimpleNamespace:
    """`accel train` (checkpoints on) stopped by SIGTERM once 2 epochs are logged, as it stood
    then: its store, run id, exit code, stderr, status, logged epochs and metrics. The train,
    reproduce and resume tests below start from this one process."""
    store = new_store(tmp_path_factory.mktemp("stopped"))
    proc = start("train", *RESUMABLE, "--tracking-uri", store, "--experiment", "pre")
    wait_for_epoch(proc, store, "pre", "train", epochs=2)
    code, err = stop(proc)
    [run] = runs(store, "pre")
    return SimpleNamespace(store=store, run_id=run.info.run_id, code=code, err=err,
                           status=run.info.status, epochs=logged_epochs(store, run.info.run_id),
                           metrics=run.data.metrics)


def test_sigterm_ends_a_train_run_killed(stopped_train):
    s = stopped_train
    assert s.code == SIGTERM_EXIT, s.err[-2000:]
    assert s.err.strip().splitlines()[-1].startswith("accel: stopped by SIGTERM")
    assert "Traceback" not in s.err
    assert s.status == "KILLED"
    assert s.metrics["val_loss"] > 0  # the finished epochs stay logged


def test_sigterm_ends_a_reproduce_rerun_killed(stopped_train):
    store, original = stopped_train.store, stopped_train.run_id
    before = {r.info.run_id: r.info.status for r in runs(store, "pre")}[original]
    proc = start("reproduce", original, "--tracking-uri", store)
    wait_for_epoch(proc, store, "pre", "reproduce")
    code, err = stop(proc)
    assert code == SIGTERM_EXIT and "Traceback" not in err, err[-2000:]
    statuses = {r.data.tags.get("accel.role"): r.info.status for r in runs(store, "pre")}
    assert statuses == {"train": before, "reproduce": "KILLED"}  # the original untouched


@pytest.mark.parametrize("workers", ["1", pytest.param("2", marks=pytest.mark.slow)])
def test_sigterm_ends_a_study_cleanly_and_the_rerun_resumes(tmp_path, workers):
    """SIGTERM once a trial of 3 is done and another trains: exit 143, nothing RUNNING, the
    stopped trials FAIL and queued again with their values. The last line's command asks for
    the trials left (not 3 more) and says the parent run is KILLED; run as printed, it runs a
    retry first and brings the study to 3 under the same parent run."""
    import optuna

    from accel.tune import open_storage
    from tests.test_study_signals import experiment, one_done_and_one_training, poll

    store, journal = new_store(tmp_path), str(tmp_path / "optuna.journal")
    tune = ["tune", experiment(tmp_path, epochs=5), "--study", "term", "--storage", journal,
            "--tracking-uri", store]
    proc = start(*tune, "--n-trials", "3", "--workers", workers)

    try:
        poll(one_done_and_one_training(journal, "term"), "a trial done and one training",
             proc, every_s=0.2)
        code, err = stop(proc, group=workers != "1")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert code == SIGTERM_EXIT, err[-3000:]
    assert "Traceback" not in err
    statuses = {r.info.run_name: r.info.status for r in runs(store, "term")}
    assert "RUNNING" not in statuses.values(), statuses
    assert statuses["study-term"] == "KILLED"
    study = optuna.load_study(study_name="term", storage=open_storage(journal))
    before = {t.number for t in study.trials if t.state.name == "COMPLETE"}
    done = len(before)
    assert 1 <= done < 3, err[-3000:]
    # The stopped trials are FAIL and queued again with their values (a preemption loses none).
    stopped = [t for t in study.trials if t.state.name == "FAIL"]
    queued = [t for t in study.trials if t.state.name == "WAITING"]
    assert stopped and len(queued) == len(stopped)
    assert len(study.trials) == done + len(stopped) + len(queued)
    assert sorted(t.system_attrs["failed_trial"] for t in queued) == [t.number for t in stopped]
    params = {t.number: t.params for t in stopped}
    assert all(t.params == params[t.system_attrs["failed_trial"]] for t in queued)
    # The last line names the study's parent run and the command that carries the study on,
    # asking for the trials left.
    [parent] = [r for r in runs(store, "term") if r.data.tags.get("accel.role") == "study"]
    last = err.strip().splitlines()[-1]
    said = re.search(r"carry the study on with: (.*?) \((\d+) of this run's 3 trial\(s\) "
                     r"left; the study's parent run ([0-9a-f]{32}) is KILLED; that command "
                     r"marks it RUNNING again", last)
    assert said and said.group(3) == parent.info.run_id, last
    assert int(said.group(2)) == 3 - done
    _, *again = shlex.split(said.group(1))  # `accel` as this environment runs it
    assert again == [*tune, "--workers", workers, "--n-trials", str(3 - done)]
    # Run as printed (in this process: a fresh one after the stopped one; spawned workers need
    # a real one).
    rerun = run_in_process(*again) if workers == "1" else subprocess.run(
        [sys.executable, "-m", "accel", *again], cwd=ROOT, capture_output=True, text=True,
        timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    trials = optuna.load_study(study_name="term", storage=open_storage(journal)).trials
    assert sum(t.state.name == "COMPLETE" for t in trials) == 3, rerun.stderr[-2000:]
    after = [t for t in trials if t.state.name == "COMPLETE" and t.number not in before]
    assert after[0].system_attrs.get("failed_trial") in params  # a retry ran first
    assert {t.system_attrs.get("failed_trial") for t in after} >= set(params)  # every one
    studies = [r for r in runs(store, "term") if r.data.tags["accel.role"] == "study"]
    assert len(studies) == 1 and studies[0].info.status == "FINISHED"


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


def test_sigterm_to_train_and_to_resume_then_resume_finishes(stopped_train):
    """Preempted twice: `accel train` stopped by SIGTERM, `accel resume` stopped by SIGTERM
    too, then `accel resume` again: every epoch logged once, the run FINISHED."""
    store, run_id, first = stopped_train.store, stopped_train.run_id, stopped_train.epochs
    assert stopped_train.status == "KILLED" and 2 <= len(first) < 12
    # The last line names the run and the command that carries it on, as pasted: each resume
    # below runs the command the stop before it printed.
    resume = carry_on_command(stopped_train.err)
    assert resume == ["resume", run_id, "--tracking-uri", store], stopped_train.err[-500:]

    proc = start(*resume)
    wait_for_epoch(proc, store, "pre", "train", epochs=len(first) + 2)
    code, err = stop(proc)
    assert code == SIGTERM_EXIT and "Traceback" not in err, err[-2000:]
    assert status_of(store, run_id) == "KILLED"
    second = logged_epochs(store, run_id)
    assert len(first) < len(second) < 12
    assert carry_on_command(err) == resume

    # The last resume in this process: a fresh one after the stopped ones.
    last = run_in_process(*resume)
    assert last.returncode == 0, last.stderr[-2000:]
    assert status_of(store, run_id) == "FINISHED"
    assert logged_epochs(store, run_id) == list(range(1, 13))


def status_of(store: str, run_id: str) -> str:
    from mlflow.tracking import MlflowClient

    return MlflowClient(store).get_run(run_id).info.status


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
