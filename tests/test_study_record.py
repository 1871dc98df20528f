"""A study's record stays what happened: a retried multi-objective trial, each trial's own peak
memory, warm starts that copy each trial once. A real `accel` process where one is killed, the
other commands in this process (`run_in_process`); tiny runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, new_store, run_cli, run_in_process

TINY = {
    "data": {"dataset": "digits", "num_workers": 0},
    "model": {"name": "test_resnet", "img_size": 16},
    "train": {"epochs": 4, "epoch_length": 6, "batch_size": 16, "device": "cpu", "amp": "off"},
    "tracking": {"system_metrics": False, "figures": False},
}
TWO_OBJECTIVES = [{"metric": "val_accuracy", "direction": "maximize"},
                  {"metric": "train_time_s", "direction": "minimize"}]
LR = {"train.lr": {"type": "float", "low": 1.0e-3, "high": 2.0e-3}}


def experiment(folder: Path, name: str, **search) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**TINY, "name": name,
                                    "search": {"pruner": "none", "space": LR, **search}}))
    return path


def client(store: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=store)


def load_study(name: str, journal: Path):
    import optuna

    from accel.tune.storage import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(str(journal)))


def trial_runs(store: str) -> list:
    c = client(store)
    return c.search_runs([e.experiment_id for e in c.search_experiments()],
                         "tags.`accel.role` = 'trial'")


def wait_for_trial_epochs(store: str, epochs: int, timeout_s: float = 180) -> str:
    """The only trial run's id once it has logged `epochs` epochs (and their checkpoint)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            runs = trial_runs(store)
            if runs and len(client(store).get_metric_history(runs[0].info.run_id,
                                                             "val_loss")) >= epochs:
                return runs[0].info.run_id
        except Exception:
            pass  # the store or the run is not there yet
        time.sleep(0.5)
    raise AssertionError(f"no trial run with {epochs} epoch(s) within {timeout_s} s")


def kill_when(args: list[str], wait) -> tuple[str, int]:
    """`accel ARGS` in its own session, SIGKILL to its whole process group once `wait()`
    answers: (what `wait` answered, the exit code)."""
    proc = subprocess.Popen([sys.executable, "-m", "accel", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        answer = wait()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return answer, proc.returncode


# --- 1: a retried trial of a multi-objective study ------------------------------------------


# make test covers it: a retried trial carried on from its checkpoint and told its values:
# tests/test_resume.py::test_a_retried_trial_carries_on_from_the_dead_trials_checkpoint; a
# two-objective trial told both values: tests/test_search.py::
# test_a_two_objective_study_keeps_its_pareto_front
@pytest.mark.slow
def test_a_retried_two_objective_trial_carries_on_and_completes(tmp_path):
    exp = experiment(tmp_path, "mo", objectives=TWO_OBJECTIVES)
    data = yaml.safe_load(exp.read_text())
    data["train"]["epoch_length"] = 40  # epochs of seconds: the kill lands inside the trial,
    exp.write_text(yaml.safe_dump(data))  # not after its last epoch (its checkpoint dropped)
    store, journal = new_store(tmp_path), tmp_path / "optuna.journal"
    args = ["tune", str(exp), "--study", "mo", "--n-trials", "1", "--storage", str(journal),
            "--tracking-uri", store]
    dead_run, code = kill_when(args, lambda: wait_for_trial_epochs(store, 1))
    assert code == -signal.SIGKILL

    out = run_in_process(*args)  # another process than the dead one: this one
    assert out.returncode == 0, out.stderr[-3000:]
    first, retry = load_study("mo", journal).trials
    assert (first.state.name, retry.state.name) == ("FAIL", "COMPLETE"), retry.user_attrs
    assert retry.params == first.params and len(retry.values) == 2
    run = client(store).get_run(retry.user_attrs["mlflow_run_id"])
    assert run.data.tags["accel.resumed_from"] == dead_run
    k = int(run.data.tags["accel.resumed_from_epoch"])
    assert k >= 1 and f"carries on after epoch {k} of run {dead_run}" in out.stderr
    steps = [m.step for m in client(store).get_metric_history(run.info.run_id, "val_loss")]
    assert sorted(steps) == [1, 2, 3, 4]  # every epoch once: the dead trial's, then its own
    assert retry.values[0] == run.data.metrics["best_val_accuracy"]
    assert client(store).get_run(dead_run).info.status == "FAILED"


# --- 6: each trial's own peak memory --------------------------------------------------------


# make test covers it: a run's own peak:
# tests/test_ablation.py::test_each_run_reports_its_own_peak_memory_not_the_process_one
@pytest.mark.slow
def test_a_small_trial_after_a_big_one_reports_its_own_peak_memory(tmp_path):
    """Two trials in one process, the big batch first, against the small one alone in its own
    process: on CPU the peak is the resident high-water mark, which must start again with every
    run (less the freed memory the allocator still holds: tens of MB)."""
    big, small = 2048, 8  # 1024 was about 470 MB above 8 under one OpenMP thread
    exp = experiment(tmp_path, "mem", metric="val_loss", direction="minimize",
                     space={"train.batch_size": {"type": "categorical", "choices": [small, big]}},
                     enqueue=[{"train.batch_size": big}, {"train.batch_size": small}])
    data = yaml.safe_load(exp.read_text())
    data["model"]["img_size"] = 64  # a batch of 2048 needs about 1 GB more than one of 8
    data["train"].update(epochs=1, epoch_length=1)
    exp.write_text(yaml.safe_dump(data))
    store = new_store(tmp_path)
    out = run_cli("tune", str(exp), "--study", "mem", "--n-trials", "2", "--tracking-uri", store,
                  "--storage", str(tmp_path / "optuna.journal"))
    assert out.returncode == 0, out.stderr[-3000:]
    peak = {int(r.data.params["train.batch_size"]): r.data.metrics["peak_memory_mb"]
            for r in trial_runs(store)}
    assert set(peak) == {big, small}
    out = run_cli("train", str(exp), f"train.batch_size={small}", "--tracking-uri", store,
                  "--experiment", "alone")
    assert out.returncode == 0, out.stderr[-3000:]
    [alone] = client(store).search_runs([client(store).get_experiment_by_name("alone")
                                         .experiment_id])
    alone = alone.data.metrics["peak_memory_mb"]
    assert peak[big] - alone > 500, (peak, alone)  # the two really differ
    assert peak[small] - alone < (peak[big] - alone) / 3, (peak, alone)  # its own peak


# --- 12: --from-study copies each trial once --------------------------------------------------


def copied_from(name: str, journal: Path) -> list[str]:
    return sorted(t.user_attrs["accel.copied_from"] for t in load_study(name, journal).trials
                  if "accel.copied_from" in t.user_attrs)


def test_from_study_copies_each_trained_trial_once_and_not_the_study_itself(tmp_path):
    """Copies keep the study and number of the trial that trained: copying a copy again, by
    whichever way it comes, adds nothing; a study copying itself is refused."""
    from tests.conftest import cli_main

    exp = experiment(tmp_path, "w")
    store, journal = new_store(tmp_path), tmp_path / "optuna.journal"

    def tune(name: str, n: int, *extra: str) -> tuple[int, str]:
        code, _, err = cli_main("tune", str(exp), "train.epochs=1", "--study", name,
                                "--n-trials", str(n), "--storage", str(journal),
                                "--tracking-uri", store, *extra)
        return code, err

    assert tune("a", 2)[0] == 0
    assert tune("b", 1, "--from-study", "a")[0] == 0
    assert copied_from("b", journal) == ["a#0", "a#1"]
    assert tune("c", 0, "--from-study", "b")[0] == 0
    assert tune("c", 0, "--from-study", "b")[0] == 0  # the same command twice
    code, err = tune("c", 0, "--from-study", "a")  # a's trials, already here through b
    assert code == 0 and "copied 0 finished trial(s) of study a (2 already here)" in err
    assert copied_from("c", journal) == ["a#0", "a#1", "b#0"]
    code, err = tune("a", 0, "--from-study", "c")  # back where they came from: only b's own
    assert code == 0 and "copied 1 finished trial(s) of study c (2 already here)" in err
    assert copied_from("a", journal) == ["b#0"]

    before = load_study("c", journal).trials
    proc = run_in_process("tune", str(exp), "--study", "c", "--n-trials", "1", "--storage",
                          str(journal), "--tracking-uri", store, "--from-study", "c")
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("accel: error: --from-study c: ") and "this study itself" in line
    assert load_study("c", journal).trials == before  # nothing copied, nothing run
