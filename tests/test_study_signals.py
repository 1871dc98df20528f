"""Faults around a study's processes, met as users meet them: a worker killed with SIGKILL, a stop
or a kill while the study is being set up, a node that dies while another ends, a stop while an
ablation makes its runs. Each leaves nothing RUNNING and loses no trial."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, TINY_OVERRIDES, new_store, run_in_process
from tests.test_signals import LONG, SIGTERM_EXIT, runs, start, wait_for_epoch

# Checkpoints on (the default): a retried trial carries on from one; 6 epochs leave time to kill
# a trial after its second.
RETRY = {
    "data": {"dataset": "digits", "num_workers": 0},
    "tracking": {"figures": False},
    "model": {"name": "test_resnet", "img_size": 16},
    "train": {"epochs": 6, "epoch_length": 8, "batch_size": 16, "device": "cpu", "amp": "off",
              "lr": 1.5e-3},
    "search": {"pruner": "none", "sampler": "random",
               "enqueue": [{"train.lr": 1.2e-3}],
               "space": {"train.lr": {"type": "float", "low": 1.0e-3, "high": 2.0e-3}}},
}


def experiment(tmp_path: Path, **train) -> str:
    exp = {**RETRY, "train": {**RETRY["train"], **train}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    return str(path)


def load(journal: str, name: str):
    import optuna

    from accel.tune import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(journal))


def one_done_and_one_training(journal: str, name: str):
    """A condition for `poll`: a trial of study `name` complete and another with an epoch
    reported (a stop then lands mid-trial, with work done to keep)."""
    def met() -> bool:
        trials = load(journal, name).trials
        return any(t.state.name == "COMPLETE" for t in trials) and any(
            t.state.name == "RUNNING" and t.intermediate_values for t in trials)
    return met


def poll(condition, what: str, proc: subprocess.Popen | None = None, timeout_s: float = 300,
         every_s: float = 0.02):
    """`condition()`'s first true answer (exceptions: the store is being written; try again),
    asked every `every_s`: a short window needs 0.02 s, a heavy question (MLflow, a database)
    over a longer one less often, not to take the cores from the processes it waits for."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            said = proc.log.read_text() if hasattr(proc, "log") else proc.communicate()[1]
            raise AssertionError(f"exited {proc.returncode} before {what}: {said[-3000:]}")
        try:
            answer = condition()
        except Exception:
            answer = None
        if answer:
            return answer
        time.sleep(every_s)
    raise AssertionError(f"no {what} within {timeout_s} s")


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def statuses(store: str, name: str) -> dict[str, str]:
    return {r.info.run_name: r.info.status for r in runs(store, name)}


# --- 3: a worker killed with SIGKILL --------------------------------------------------------------


def _trial_with_epochs(journal: str, epochs: int):
    """(trial number, its worker's pid) once a RUNNING trial has reported `epochs` epochs: read
    from the journal alone, a cheap poll that leaves the cores to the workers."""
    for t in load(journal, "w").trials:
        if t.state.name == "RUNNING" and len(t.intermediate_values) >= epochs:
            return t.number, t.user_attrs["accel.pid"]
    return None


def test_a_worker_killed_with_sigkill_has_its_trial_retried_from_its_checkpoint(tmp_path):
    """`--workers 2`, one worker killed inside a trial: its trial FAIL (run FAILED), queued
    again and carried on from its last checkpoint; the study runs all its trials and the
    parent run ends FINISHED. The two workers share one journal and one SQLite store: each
    trial has one run under the study's, the live worker's lines reach the invocation's stderr,
    and no "database is locked" reaches anyone."""
    store, journal = new_store(tmp_path), str(tmp_path / "optuna.journal")
    proc = start("tune", experiment(tmp_path), "--study", "w", "--storage", journal,
                 "--tracking-uri", store, "--n-trials", "2", "--workers", "2")
    try:
        number, pid = poll(lambda: _trial_with_epochs(journal, 2), "trial with 2 epochs", proc,
                           every_s=0.25)
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, err[-3000:]
    study = load(journal, "w")
    dead = study.trials[number]
    assert dead.state.name == "FAIL"
    [retry] = [t for t in study.trials if t.system_attrs.get("failed_trial") == number]
    assert retry.state.name == "COMPLETE" and retry.params == dead.params
    assert sum(t.state.name == "COMPLETE" for t in study.trials) == 2, "every trial ran"
    by_id = {r.info.run_id: r for r in runs(store, "w")}
    [parent] = [r for r in by_id.values() if r.data.tags.get("accel.role") == "study"]
    trial_runs = {int(r.data.tags["optuna.trial_number"]): r for r in by_id.values()
                  if r.data.tags.get("accel.role") == "trial"}
    assert sorted(trial_runs) == [t.number for t in study.trials]  # one run per trial
    assert len(trial_runs) + 1 == len(by_id)
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id
               for r in trial_runs.values())
    dead_run = trial_runs[number]
    assert dead_run.info.status == "FAILED" and dead_run.data.tags["optuna.trial_state"] == "FAIL"
    resumed = by_id[retry.user_attrs["mlflow_run_id"]]
    assert resumed.data.tags["accel.resumed_from"] == dead_run.info.run_id
    assert int(resumed.data.tags["accel.resumed_from_epoch"]) >= 1
    assert parent.info.status == "FINISHED"
    assert "RUNNING" not in {r.info.status for r in by_id.values()}
    assert len({t.user_attrs["accel.pid"] for t in study.trials}) >= 2, "both workers ran"
    died = re.search(r"worker (\d) died", err)  # the other one's trial lines reach stderr
    assert died and f"[worker {1 - int(died.group(1))}] trial " in err, err[-3000:]
    assert "database is locked" not in err


# --- 9: a stop or a kill during the study's set-up --------------------------------------------


def _being_set_up(journal: str, name: str) -> bool:
    """The study exists, names its creator and has no definition yet (written last): it is
    being set up. Only the journal is read: a cheap poll, well inside the window."""
    if not Path(journal).is_file():
        return False
    attrs = load(journal, name).user_attrs  # its creator is recorded just after it is made
    return "accel.created_by" in attrs and "accel.definition" not in attrs


@pytest.mark.parametrize("sig", [signal.SIGTERM,
                                 pytest.param(signal.SIGKILL, marks=pytest.mark.slow)],
                         ids=["sigterm", "sigkill"])
def test_a_stop_during_study_set_up_leaves_a_whole_study_and_the_rerun_runs_the_baseline(
        tmp_path, sig):
    """Stopped (SIGTERM: set-up completes, then the stop; nothing RUNNING) or killed (SIGKILL:
    the rerun adopts the half-made study at once and queues what its creator would have)
    while the study and its parent run are being made: the rerun runs the file's
    `search.enqueue` entry and the baseline first, and ends the parent run."""
    store, journal = new_store(tmp_path), str(tmp_path / "optuna.journal")
    tune = ["tune", experiment(tmp_path, epochs=1), "--study", "s", "--storage", journal,
            "--tracking-uri", store]
    proc = start(*tune, "--n-trials", "1")
    try:
        poll(lambda: _being_set_up(journal, "s"), "study set-up", proc)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    if sig == signal.SIGTERM:
        assert proc.returncode == SIGTERM_EXIT and "Traceback" not in err, err[-3000:]
        assert "RUNNING" not in statuses(store, "s").values(), statuses(store, "s")
        assert "accel.definition" in load(journal, "s").user_attrs, "set-up left half done"
    half_made = "accel.definition" not in load(journal, "s").user_attrs
    rerun = run_in_process(*tune, "--n-trials", "2")  # a fresh process after the stopped one
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    if half_made:  # killed before the definition: adopted at once, not after a wait
        assert f"its creator, process {proc.pid}, is gone" in rerun.stderr, rerun.stderr
    trials = load(journal, "s").trials
    first = [t for t in trials if "failed_trial" not in t.system_attrs]
    assert first[0].user_attrs.get("accel.enqueued_from") == "search.enqueue[0]"
    assert first[0].params == {"train.lr": 1.2e-3}
    assert first[1].user_attrs.get("accel.baseline") and first[1].params == {"train.lr": 1.5e-3}
    assert len(first) == 2, "queued once"
    done = {t.system_attrs.get("failed_trial", t.number) for t in trials
            if t.state.name == "COMPLETE"}  # a trial killed with the process is retried
    assert done == {0, 1}
    assert statuses(store, "s")["study-s"] == "FINISHED"
    assert "RUNNING" not in statuses(store, "s").values()


# --- 16: a node that dies while the last other node ends --------------------------------------


def test_accel_best_finishes_a_parent_run_whose_nodes_are_all_gone(tmp_path):
    """Node B works on the study while node A ends (A leaves the parent run RUNNING for B);
    then B is killed: its lease never ends. `accel best` finishes the parent run (FAILED, with
    the reason) instead of leaving it RUNNING for ever."""
    store, journal = new_store(tmp_path), str(tmp_path / "optuna.journal")
    tune = ["tune", *LONG, "--study", "n", "--storage", journal, "--tracking-uri", store]
    node_b = start(*tune, "--n-trials", "1")
    try:
        wait_for_epoch(node_b, store, "n", "trial")
        node_a = run_in_process(*tune, "--n-trials", "0")  # node A: this process
        assert node_a.returncode == 0, node_a.stderr[-3000:]
        assert "other node(s) still work on the study" in node_a.stderr
        assert statuses(store, "n")["study-n"] == "RUNNING"
    finally:
        kill_group(node_b)  # SIGKILL: B ends nothing
    best = run_in_process("best", "--study", "n", "--storage", journal, "--tracking-uri", store)
    assert "Traceback" not in best.stderr, best.stderr[-3000:]
    [parent] = [r for r in runs(store, "n") if r.data.tags["accel.role"] == "study"]
    assert parent.info.status == "FAILED"
    assert "lease" in parent.data.tags["accel.error"]


# --- ablate: a stop while the ablation makes its runs ----------------------------------------


def test_sigterm_while_an_ablation_makes_its_runs_leaves_none_running(tmp_path):
    store = new_store(tmp_path)
    proc = start("ablate", *TINY_OVERRIDES, "tracking.experiment=ab", "--techniques", "ga,amp,pm",
                 "--tracking-uri", store)
    try:
        poll(lambda: any(r.data.tags.get("accel.role") == "ablation" for r in runs(store, "ab")),
             "ablation parent run", proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert proc.returncode == SIGTERM_EXIT and "Traceback" not in err, err[-3000:]
    found = statuses(store, "ab")
    assert found and "RUNNING" not in found.values(), found


# --- a stop that lands inside a garbage-collector callback ------------------------------------

STOP_IN_CALLBACK = """
import os, signal, time, weakref
from accel import signals
signals.handle_stops()
class A: pass
def callback(_):  # the stop lands inside a weakref callback, where Python cannot raise
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(10000))
a = A()
ref = weakref.ref(a, callback)
try:
    del a
    deadline = time.time() + 60
    while time.time() < deadline:
        pass
    print("the stop was lost")
except KeyboardInterrupt:
    print("stopped", signals.exit_code())
"""


def test_a_stop_raised_inside_a_garbage_collector_callback_is_not_lost():
    """Python prints such an exception as "Exception ignored" and drops it: the stop is
    delivered again to ordinary code (seen as a traceback in a stopped study's output)."""
    out = subprocess.run([sys.executable, "-c", STOP_IN_CALLBACK], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "stopped 143", out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
