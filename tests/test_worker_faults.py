"""Faults inside a worker, met as a cluster meets them, across real processes: a worker frozen
past the heartbeat grace period (SIGSTOP, then SIGCONT: a long GC pause, a swapped-out process,
a VM frozen for a live migration) while it trains or before its trial's run exists, and a stop
signal that lands inside a store call. The record keeps one run per trial, nothing RUNNING, no
traceback, and the worker keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, new_store
from tests.test_store_outages import ended as finish
from tests.test_study_signals import kill_group, poll

# Trials of 16 epochs, each held to at least `EPOCH_S` (PACED): a frozen worker that trained on
# after it came back would log more of them, and the other worker's trial runs on past the freeze
# (2 epochs in) by more than the grace period on any machine, so that its next trial begins by
# failing the frozen one as stale. Unpaced, a fast machine's epochs took under 0.2 s: the other
# worker finished its trial and the next within the grace period, found no trial stale, and had
# used up the study's slots, so nothing ever failed the frozen trial.
STUDY = {
    "name": "frozen",
    "data": {"dataset": "digits", "num_workers": 0},
    "tracking": {"figures": False},
    "model": {"name": "test_resnet", "img_size": 16},
    "train": {"epochs": 16, "epoch_length": 8, "batch_size": 16, "device": "cpu", "amp": "off"},
    "search": {"pruner": "none", "sampler": "random",
               "space": {"train.lr": {"type": "float", "low": 1.0e-3, "high": 2.0e-3}}},
}
HEARTBEAT_S, GRACE_S = 1, 4
EPOCH_S = 0.6  # 14 epochs after the freeze: 8.4 s, twice the grace period

# Every process of the study: an epoch's report waits out the rest of `EPOCH_S` (a sleep: it
# takes no core from the other worker), so the trials' length does not hang on the machine.
PACED = f"""
import time
import optuna.trial

_report, _last = optuna.trial.Trial.report, [time.monotonic()]

def report(self, value, step):
    time.sleep(max(0.0, {EPOCH_S} - (time.monotonic() - _last[0])))
    _last[0] = time.monotonic()
    return _report(self, value, step)

optuna.trial.Trial.report = report
"""


def start(tmp_path: Path, storage: str, store: str, *args: str, study: dict | None = None,
          patch: str = "") -> subprocess.Popen:
    """`accel tune` in its own session, its epochs paced (PACED); `patch`: more Python run first
    in every process of it (the spawned workers too), through the same sitecustomize module."""
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(study or STUDY))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ACCEL_"))}
    env.update(OMP_NUM_THREADS="1", ACCEL_HEARTBEAT_S=str(HEARTBEAT_S),
               ACCEL_GRACE_S=str(GRACE_S))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(PACED + patch)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(ROOT)])
    log = (tmp_path / "tune.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "accel", "tune", str(config), "--storage",
                             storage, "--tracking-uri", store, *args], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    proc.log = Path(log.name)
    return proc


def record(storage: str, store: str, name: str = "frozen") -> tuple[list, dict[int, list]]:
    """(the study's trials, trial number -> its trial runs)."""
    import optuna
    from mlflow.tracking import MlflowClient

    from accel.tune import open_storage

    trials = optuna.load_study(study_name=name, storage=open_storage(storage)).trials
    client = MlflowClient(store)
    exp = client.get_experiment_by_name(name)
    runs: dict[int, list] = {}
    for run in client.search_runs([exp.experiment_id], "tags.`accel.role` = 'trial'",
                                  max_results=1000):
        runs.setdefault(int(run.data.tags["optuna.trial_number"]), []).append(run)
    return trials, runs


def assert_whole(trials, runs, out: str) -> None:
    """One run per trial that started, none RUNNING, no trial RUNNING, no traceback."""
    assert "Traceback" not in out, out[-4000:]
    assert not [t.number for t in trials if t.state.name == "RUNNING"], out[-3000:]
    assert sorted(runs) == [t.number for t in trials if t.state.name != "WAITING"]
    assert all(len(r) == 1 for r in runs.values()), {n: len(r) for n, r in runs.items()}
    assert all(r[0].info.status != "RUNNING" for r in runs.values())


def frozen_until(pid: int, condition, proc: subprocess.Popen):
    """SIGSTOP the worker `pid` until `condition()` (its trial failed as stale by the other
    worker), then SIGCONT it; returns what the condition answered."""
    os.kill(pid, signal.SIGSTOP)
    try:
        return poll(condition, "its trial failed as stale", proc, timeout_s=120, every_s=0.25)
    finally:
        os.kill(pid, signal.SIGCONT)


def finished_whole(proc: subprocess.Popen, storage: str, store: str):
    """(trials, runs per trial, output) once the study ended with exit 0, its record whole."""
    code, out = finish(proc)
    assert code == 0, out[-4000:]
    trials, runs = record(storage, store)
    assert_whole(trials, runs, out)
    return trials, runs, out


def trials_of(url: str):
    """A function that reads the study's trials through one storage opened once: polling
    through a new storage each time leaves a database connection per call until the garbage
    collector comes, and a busy machine's many polls ran PostgreSQL out of connections."""
    import optuna

    from accel.tune import open_storage

    storage = open_storage(url)
    return lambda: optuna.load_study(study_name="frozen", storage=storage).trials


def training_trial(trials):
    """(trial number, its worker's pid) of a RUNNING trial past its second epoch."""
    for t in trials():
        if t.state.name == "RUNNING" and len(t.intermediate_values) >= 2:
            return t.number, t.user_attrs["accel.pid"]
    return None


def test_a_worker_frozen_past_the_grace_leaves_its_trial_to_the_retry_and_serves_on(
        tmp_path, postgres_url):
    """Two workers; one frozen mid-trial until the other fails its trial as stale and queues
    it again, then continued: within a heartbeat it stops training that trial (no epoch logged
    after it came back), says so in one line, and goes on to finish trials of its own."""
    store = new_store(tmp_path)
    proc = start(tmp_path, postgres_url, store, "--n-trials", "3", "--workers", "2")
    try:
        trials = trials_of(postgres_url)
        number, pid = poll(lambda: training_trial(trials), "a trial in training", proc,
                           every_s=0.25)
        frozen_until(pid, lambda: trials()[number].state.name == "FAIL", proc)
        back = time.time()
        trials, runs, out = finished_whole(proc, postgres_url, store)
    finally:
        kill_group(proc)
    assert f"trial {number:03d} left to its retry: it was failed as stale" in out, out[-3000:]
    from mlflow.tracking import MlflowClient

    (lost,) = runs[number]
    assert lost.info.status == "FAILED"
    assert "stopped sending heartbeats" in lost.data.tags["accel.error"]
    epochs = MlflowClient(store).get_metric_history(lost.info.run_id, "val_loss")
    assert all(m.timestamp / 1000 < back for m in epochs), "it trained on after it came back"
    [retry] = [t for t in trials if t.system_attrs.get("failed_trial") == number]
    assert retry.state.name == "COMPLETE"
    served = [t for t in trials if t.user_attrs.get("accel.pid") == pid and t.number > number]
    assert served and all(t.state.name == "COMPLETE" for t in served), "the worker died"
    assert sum(t.state.name == "COMPLETE" for t in trials) == 3  # the lost trial's slot too


# Every process of the study: the first trial's model is built slowly (a big dataset read), so
# that the test can freeze its worker before the trial's run exists.
SLOW_BUILD = """
import os, pathlib, time
import accel.train as train

_build, _marker = train.build, pathlib.Path(os.environ["FAULT_MARKER"])

def build(*args, **kwargs):
    if not _marker.exists():
        _marker.write_text(str(os.getpid()))
        time.sleep(3)
    return _build(*args, **kwargs)

train.build = build
"""


# make test covers it: a frozen worker:
# test_a_worker_frozen_past_the_grace_leaves_its_trial_to_the_retry_and_serves_on
@pytest.mark.slow
def test_a_worker_frozen_before_its_trial_has_a_run_makes_no_second_run(tmp_path,
                                                                         postgres_url):
    """Frozen while it builds a trial's model (no run yet): the other worker fails the trial as
    stale and gives it its run; the worker that comes back makes no second one."""
    store = new_store(tmp_path)
    marker = tmp_path / "building"
    os.environ["FAULT_MARKER"] = str(marker)
    try:
        proc = start(tmp_path, postgres_url, store, "--n-trials", "4", "--workers", "2",
                     study={**STUDY, "train": {**STUDY["train"], "epochs": 6}},
                     patch=SLOW_BUILD)
    finally:
        del os.environ["FAULT_MARKER"]
    try:
        pid = int(poll(lambda: marker.exists() and marker.read_text(), "a trial building", proc))
        trials = trials_of(postgres_url)
        (number,) = frozen_until(pid, lambda: _failed_trial_of(trials, pid), proc)
        trials, runs, out = finished_whole(proc, postgres_url, store)
    finally:
        kill_group(proc)
    assert f"trial {number:03d} left to its retry" in out, out[-3000:]
    assert runs[number][0].info.status == "FAILED"


def _failed_trial_of(trials, pid: int) -> tuple[int] | None:
    for t in trials():
        if t.user_attrs.get("accel.pid") == pid and t.state.name == "FAIL":
            return (t.number,)
    return None


# Every process of the study: the storage method named by $FAULT_SLOW is slowed to 4 s at
# its first call whose arguments show $FAULT_ARG, and a marker file says when it has begun.
SLOW_CALL = """
import os, pathlib, time
from optuna.storages import RDBStorage

_name, _marker = os.environ["FAULT_SLOW"], pathlib.Path(os.environ["FAULT_MARKER"])
_method = getattr(RDBStorage, _name)

def slow(self, *args, **kwargs):
    if not _marker.exists() and os.environ["FAULT_ARG"] in repr((args, kwargs)):
        _marker.write_text("in")
        time.sleep(4)
    return _method(self, *args, **kwargs)

setattr(RDBStorage, _name, slow)
"""


@pytest.mark.parametrize(("method", "arg", "state", "status"), [
    ("set_trial_state_values", "COMPLETE", "COMPLETE", "FINISHED"),  # the tell
    # make test covers it: a stop held inside a store call and raised after it, as the tell's
    # case above; a stop between epochs ends a trial FAIL and its run KILLED in
    # tests/test_signals.py::test_sigterm_ends_a_study_cleanly_and_the_rerun_resumes
    pytest.param("set_trial_intermediate_value", "", "FAIL", "KILLED",  # an epoch reported
                 marks=pytest.mark.slow),
], ids=["set_trial_state_values-COMPLETE-COMPLETE-FINISHED",
        "set_trial_intermediate_value--FAIL-KILLED"])
def test_sigterm_inside_a_store_call_is_raised_after_it(tmp_path, method, arg, state, status):
    """SIGTERM while the worker is inside a storage call: the call finishes, then the stop's one
    line and exit 143, no traceback; the trial is as far as it got (told COMPLETE; or stopped
    in training, FAIL and queued again, its run KILLED)."""
    store, storage = new_store(tmp_path), f"sqlite:///{tmp_path / 'optuna.db'}"
    marker = tmp_path / "inside"
    os.environ.update(FAULT_SLOW=method, FAULT_ARG=arg, FAULT_MARKER=str(marker))
    try:
        proc = start(tmp_path, storage, store, "--n-trials", "2",
                     study={**STUDY, "train": {**STUDY["train"], "epochs": 3}}, patch=SLOW_CALL)
    finally:
        for key in ("FAULT_SLOW", "FAULT_ARG", "FAULT_MARKER"):
            del os.environ[key]
    try:
        poll(lambda: marker.exists(), "the slow store call", proc)
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc, timeout_s=120)
    finally:
        kill_group(proc)
    assert code == 128 + signal.SIGTERM, out[-4000:]
    assert out.strip().splitlines()[-1].startswith("accel: interrupted; "), out[-2000:]
    trials, runs = record(storage, store)
    assert_whole(trials, runs, out)
    assert trials[0].state.name == state and runs[0][0].info.status == status
    if state == "FAIL":
        assert trials[0].user_attrs["accel.stopped"] is True
        assert [t.system_attrs.get("failed_trial") for t in trials[1:]] == [0]  # queued again
