"""A study's stores going away for seconds under a running trial, across real processes: the
tracking server restarted (the trial waits, then completes; its finished checkpoint slots are
deleted on the server), PostgreSQL restarted under a worker (no traceback, no trial lost)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from checks.chaos.services import LocalPostgres, MlflowServer, postgres_bin
from tests.conftest import ROOT

# Trials of a few seconds, several epochs each: a store can go away inside one.
STUDY = {
    "data": {"dataset": "digits", "num_workers": 0},
    "tracking": {"figures": False},
    "model": {"name": "test_resnet", "img_size": 16},
    "train": {"epochs": 5, "epoch_length": 8, "batch_size": 16, "device": "cpu", "amp": "off"},
    "search": {"pruner": "none", "space": {
        "train.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}}},
}


def start_study(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    config = tmp_path / "outage.yaml"
    config.write_text(yaml.safe_dump({"name": "outage", **STUDY}))
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ACCEL_"))}
    environ.update(env or {})
    log = (tmp_path / "tune.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "accel", "tune", str(config), *args],
                            cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    proc.log = Path(log.name)
    return proc


def wait_for_an_epoch(tracking_uri: str, proc: subprocess.Popen, timeout_s: float = 240) -> str:
    """A trial run that has logged an epoch: the study is inside a trial."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, proc.log.read_text()[-3000:]
        try:
            exp = client.get_experiment_by_name("outage")
            runs = client.search_runs([exp.experiment_id], "tags.`accel.role` = 'trial'") \
                if exp else []
            for run in runs:
                if client.get_metric_history(run.info.run_id, "val_loss"):
                    return run.info.run_id
        except Exception:
            pass  # not created yet
        time.sleep(0.5)
    raise AssertionError(f"no trial epoch within {timeout_s} s: {proc.log.read_text()[-3000:]}")


def ended(proc: subprocess.Popen, timeout_s: float = 600) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    return code, proc.log.read_text()


def the_record(tracking_uri: str, storage) -> tuple[list, dict]:
    """(the study's trials, trial number -> its runs)."""
    import optuna
    from mlflow.tracking import MlflowClient

    trials = optuna.load_study(study_name="outage", storage=storage).trials
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("outage")
    runs: dict[int, list] = {}
    for run in client.search_runs([exp.experiment_id], "tags.`accel.role` = 'trial'",
                                  max_results=1000):
        runs.setdefault(int(run.data.tags["optuna.trial_number"]), []).append(run)
    return trials, runs


def test_a_tracking_server_stopped_mid_trial_is_waited_for_and_checkpoints_are_dropped(
        tmp_path):
    """The server stopped inside a trial for 2 s and the time it takes to start again (several
    seconds more): the trial waits with one line, then completes; its one FINISHED run's two
    checkpoint slots were deleted on the server (best.pt stays)."""
    from mlflow.tracking import MlflowClient

    server = MlflowServer(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    server.start()
    try:
        storage = str(tmp_path / "optuna.journal")
        proc = start_study(tmp_path, "--n-trials", "1", "--storage", storage, "--tracking-uri",
                           server.url)
        wait_for_an_epoch(server.url, proc)
        server.stop()
        time.sleep(2)
        server.start()
        code, out = ended(proc)
        assert code == 0, out[-3000:]
        trials, runs = the_record(server.url, _journal(storage))
        client = MlflowClient(server.url)  # the artifacts, as the server lists them
        listed = {t.number: sorted(a.path for a in client.list_artifacts(
            runs[t.number][0].info.run_id, "checkpoint")) for t in trials}
    finally:
        server.stop()
    assert "does not answer" in out and "answers again after" in out, out[-3000:]
    assert "Traceback" not in out and "checkpoint stays" not in out, out[-3000:]
    assert [t.state.name for t in trials] == ["COMPLETE"]
    for t in trials:
        (run,) = runs[t.number]
        assert run.info.status == "FINISHED"
        assert listed[t.number] == ["checkpoint/best.pt"], listed
    slots = list((tmp_path / "artifacts").rglob("last-*.pt"))
    assert slots == []  # gone from the server's disk too, not only from its listing


def _journal(path: str):
    import optuna

    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))


@pytest.fixture
def own_postgres():
    if postgres_bin() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no PostgreSQL server programs; CI=true, so this must not pass as a skip")
        pytest.skip("no PostgreSQL server programs (initdb, pg_ctl)")
    pg = LocalPostgres()
    try:
        pg.start()
        yield pg
    finally:
        pg.close()


def test_postgres_restarted_under_a_worker_costs_no_traceback_and_no_trial(tmp_path,
                                                                          own_postgres):
    """The study's PostgreSQL stopped (fast: connections ended) inside a trial and started
    again 2 s later: the worker waits for it with one line, no traceback; every trial ends
    COMPLETE, or FAIL and queued again; none is left RUNNING; one run per trial."""
    from tests.conftest import new_store

    storage = own_postgres.create_database("optuna")
    store = new_store(tmp_path)
    proc = start_study(tmp_path, "--n-trials", "3", "--storage", storage, "--tracking-uri",
                       store, env={"ACCEL_HEARTBEAT_S": "1", "ACCEL_GRACE_S": "30"})
    wait_for_an_epoch(store, proc)
    own_postgres.stop("fast")
    time.sleep(2)
    own_postgres.start()
    code, out = ended(proc)
    assert code == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "the Optuna storage" in out and "does not answer" in out, out[-3000:]
    from accel.tune import open_storage

    trials, runs = the_record(store, open_storage(storage))
    states = [t.state.name for t in trials]
    assert "RUNNING" not in states and states.count("COMPLETE") >= 2, states
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    assert all(t.number in retried for t in trials if t.state.name == "FAIL")
    assert sorted(runs) == [t.number for t in trials if t.state.name != "WAITING"]
    assert all(len(r) == 1 and r[0].info.status != "RUNNING" for r in runs.values())


# make test covers it: an outage waited for:
# test_a_tracking_server_stopped_mid_trial_is_waited_for_and_checkpoints_are_dropped
@pytest.mark.slow
def test_a_tracking_server_away_past_the_window_ends_the_invocation_and_loses_nothing(
        tmp_path):
    """The server stopped inside a trial and not back within $ACCEL_OUTAGE_S: the invocation
    ends with exit 1 and one line naming the server; the trial is FAIL and queued again. Once the
    server is back, `accel best` closes the run the trial left RUNNING, and the next
    invocation carries the queued trial on."""
    server = MlflowServer(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    server.start()
    storage = str(tmp_path / "optuna.journal")
    args = ("--storage", storage, "--tracking-uri", server.url)
    try:
        proc = start_study(tmp_path, "--n-trials", "1", *args, env={"ACCEL_OUTAGE_S": "5"})
        wait_for_an_epoch(server.url, proc)
        server.stop()
        code, out = ended(proc)
        assert code == 1, out[-3000:]
        last = out.strip().splitlines()[-1]
        assert last.startswith(f"accel: error: the MLflow server at {server.url} did not "
                               "answer for "), out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        import optuna

        first, queued = optuna.load_study(study_name="outage", storage=_journal(storage)).trials
        assert (first.state.name, queued.state.name) == ("FAIL", "WAITING")
        assert queued.system_attrs["failed_trial"] == first.number

        server.start()
        best = subprocess.run([sys.executable, "-m", "accel", "best", "--study", "outage",
                               *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert "closed the MLflow runs left RUNNING (or never made) of finished trial(s) 0" in \
            best.stderr, \
            best.stderr[-3000:]
        trials, runs = the_record(server.url, _journal(storage))
        assert runs[0][0].info.status == "FAILED"
        again = start_study(tmp_path, "--n-trials", "1", *args)
        code, out = ended(again)
        assert code == 0, out[-3000:]
        trials, runs = the_record(server.url, _journal(storage))
    finally:
        server.stop()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert "trial 1 retries trial 0: carries on after epoch" in out, out[-3000:]
    assert all(len(r) == 1 and r[0].info.status != "RUNNING" for r in runs.values())
