"""Resume: a run stopped after epoch k and carried on by `accel resume` ends bitwise equal to the
same run never stopped (weights and every logged metric but the clock's); checkpoints survive a
process killed mid-write; a checkpoint holding pickled objects is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from accel.train import checkpoint
from tests.conftest import ROOT, TINY_OVERRIDES, new_store, run_cli, run_in_process

# Accumulation with a short last window (10 micro-batches, windows of 4), a warm-up then cosine
# schedule; one pass over the 320 training images is 20 batches, so epoch 1 ends inside a pass
# and epoch 2 at its end (where the sampler draws from its generator once more on the way out):
# every piece of state the resume has to carry matters here.
RESUMABLE = [*TINY_OVERRIDES, "train.epochs=3", "train.epoch_length=10", "data.train_limit=320",
             "train.accumulation_steps=4", "train.scheduler=cosine", "train.warmup_epochs=1"]
# What must match bitwise; the clock's metrics (epoch_time_s, train_throughput, peak memory)
# cannot.
EXACT = ("train_loss", "val_loss", "val_accuracy", "val_f1", "lr", "grad_norm")


def client(store: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=store)


def only_run(store: str) -> str:
    c = client(store)
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0].info.run_id


def curves(store: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    c = client(store)
    return {name: sorted((m.step, m.value) for m in c.get_metric_history(run_id, name))
            for name in [*EXACT, "best_epoch", "best_val_accuracy"]}


def weights(store: str, run_id: str, tmp_path: Path) -> dict[str, torch.Tensor]:
    dest = tmp_path / run_id
    dest.mkdir(parents=True)
    path = client(store).download_artifacts(run_id, "checkpoint/best.pt", str(dest))
    return torch.load(path, map_location="cpu", weights_only=True)


def artifacts(store: str, run_id: str) -> list[str]:
    return [f.path for f in client(store).list_artifacts(run_id, "checkpoint")]


# `accel ARGS` in a process that sends itself SIGTERM right after epoch $STOP_AFTER's checkpoint
# is written: a stop at a known epoch, through the real signal handling.
STOP_AFTER_EPOCH = """
import os, signal, sys
from accel.train.run_log import RunLog
real = RunLog.last_state
def last_state(self, parts):
    real(self, parts)
    if parts.trainer.state.epoch == int(os.environ["STOP_AFTER"]):
        os.kill(os.getpid(), signal.SIGTERM)
RunLog.last_state = last_state
from accel.cli import main
sys.exit(main(sys.argv[1:]))
"""


def train_stopped_after(k: int, args: list[str]) -> subprocess.CompletedProcess:
    """`accel train ARGS` in its own process, stopped by SIGTERM after epoch k."""
    return subprocess.run([sys.executable, "-c", STOP_AFTER_EPOCH, "train", *args], cwd=ROOT,
                          env={**os.environ, "STOP_AFTER": str(k)}, capture_output=True,
                          text=True, timeout=300)


def stopped_here_after(k: int, *args: str) -> subprocess.CompletedProcess:
    """`accel ARGS` in this process, stopped after epoch k's checkpoint as SIGTERM stops it:
    the handler `accel` installed for SIGTERM is called there (no signal is sent to this
    process), so the command ends as a stopped one does: its run KILLED, exit 143. For tests
    of what a stop leaves (checkpoints, a run to resume or refuse), not of the signal itself
    (this file's real stops and tests/test_signals.py)."""
    from accel import signals
    from accel.train.run_log import RunLog

    real = RunLog.last_state

    def last_state(self, run):
        real(self, run)
        if run.trainer.state.epoch == k:
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)

    RunLog.last_state = last_state
    try:
        return run_in_process(*args)
    finally:
        RunLog.last_state = real
        signals._received.clear()  # the stop is over: later commands of this process start clean


def stopped_and_resumed(args: list[str], k: int, tmp_path: Path, *, here: bool = False):
    """`accel train ARGS` never stopped, and the same run stopped by SIGTERM after epoch k (left
    KILLED) and carried on by `accel resume`, each in its own processes (`here`: the first two in
    this process, the stop through accel's handler; the resume still a fresh process): ((store,
    run id) of the resumed run, (store, run id) of the uninterrupted one, the resume's stderr)."""
    from tests.conftest import new_store

    ref_store = new_store(tmp_path / "reference")
    train = run_in_process if here else run_cli
    out = train("train", *args, "--tracking-uri", ref_store)
    assert out.returncode == 0, out.stderr[-3000:]
    store = new_store(tmp_path / "stopped")
    stopped = (stopped_here_after(k, "train", *args, "--tracking-uri", store) if here
               else train_stopped_after(k, [*args, "--tracking-uri", store]))
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    run_id = only_run(store)
    assert client(store).get_run(run_id).info.status == "KILLED"
    out = run_cli("resume", run_id, "--tracking-uri", store)
    assert out.returncode == 0, out.stderr[-3000:]
    assert client(store).get_run(run_id).info.status == "FINISHED"
    return (store, run_id), (ref_store, only_run(ref_store)), out.stderr


def same_curves_and_weights(run: tuple[str, str], reference: tuple[str, str], epochs: int,
                            tmp_path: Path) -> dict[str, torch.Tensor]:
    """Asserts that `run` (store, run id) logged `reference`'s curves, bitwise, over `epochs`
    epochs and ended with its best weights; returns them."""
    mine, ref = curves(*run), curves(*reference)
    assert mine == ref and len(ref["train_loss"]) == epochs
    final = weights(*run, tmp_path / "a")
    expected = weights(*reference, tmp_path / "b")
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[key], expected[key]) for key in expected)
    return final


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run never interrupted, in this process (a run is bitwise the same in any process:
    tests/test_reproduce_across_commits.py reproduces a subprocess's run here exactly)."""
    tmp = tmp_path_factory.mktemp("reference")
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    out = run_in_process("train", *RESUMABLE, "--tracking-uri", store)
    assert out.returncode == 0, out.stderr
    return store, only_run(store), tmp


@pytest.mark.parametrize("k", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_resumed_run_ends_bitwise_equal_to_the_uninterrupted_one(k, reference, tmp_path):
    """Two processes, as users run them: a run stopped by SIGTERM after epoch k (1: inside a
    pass over the data; 2: at its end), `accel resume` of that run; against the reference,
    never stopped."""
    ref_store, ref_run, ref_tmp = reference
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    stopped = train_stopped_after(k, [*RESUMABLE, "--tracking-uri", store])
    assert stopped.returncode == 143, stopped.stderr
    run_id = only_run(store)
    assert client(store).get_run(run_id).info.status == "KILLED"
    # Stopped between epoch k's checkpoint and its metrics: the resume logs them.
    assert [s for s, _ in curves(store, run_id)["val_loss"]] == list(range(1, k))

    out = run_cli("resume", run_id, "--tracking-uri", store)
    assert out.returncode == 0, out.stderr
    assert f"after epoch {k} of 3" in out.stderr
    run = client(store).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["accel.resumed_from_epoch"] == str(k)
    mine, ref = curves(store, run_id), curves(ref_store, ref_run)
    assert mine == ref  # each epoch once, the same values
    assert mine["best_epoch"] == [(3, 3.0)]  # so best.pt holds the final weights
    final, ref = weights(store, run_id, tmp_path), weights(ref_store, ref_run, ref_tmp / str(k))
    assert final.keys() == ref.keys()
    assert all(torch.equal(final[key], ref[key]) for key in ref)
    # Finished: the last-epoch checkpoint is dropped (it is not resumed), best.pt stays.
    assert artifacts(store, run_id) == ["checkpoint/best.pt"]


def test_a_finished_run_or_one_without_checkpoint_is_not_resumed(reference, tmp_path):
    """Refusals, read in this process: a finished run, an unknown one, and one stopped after an
    epoch that kept no checkpoint."""
    ref_store, ref_run, _ = reference
    out = run_in_process("resume", ref_run, "--tracking-uri", ref_store)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        f"accel: error: run {ref_run} is FINISHED: nothing to resume "
        f"(`accel reproduce {ref_run}` trains it again)")
    out = run_in_process("resume", "0123456789abcdef", "--tracking-uri", ref_store)
    assert out.returncode == 2 and "no run '0123456789abcdef'" in out.stderr

    # Stopped after an epoch, but it kept no checkpoint: there is nothing to carry on from.
    store = new_store(tmp_path)
    stopped = stopped_here_after(1, "train", *RESUMABLE, "tracking.log_checkpoint=false",
                                 "--tracking-uri", store)
    assert stopped.returncode == 143, stopped.stderr
    run_id = only_run(store)
    out = run_in_process("resume", run_id, "--tracking-uri", store)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"accel: error: run {run_id} has no last-epoch checkpoint (checkpoint/last-a.pt, "
        "last-b.pt): it stopped before its first epoch ended or ran with "
        f"tracking.log_checkpoint=false; `accel reproduce {run_id}` trains it from the start")
    run = client(store).get_run(run_id)
    assert run.info.status == "KILLED"  # untouched
    assert [s for s, _ in curves(store, run_id)["val_loss"]] == []


# A real process killed (SIGKILL) while it writes epoch 2's checkpoint into an artifact store that
# writes in place (MLflow's local store itself writes to a temporary name and renames): half the
# file lands, then the process dies as the kernel would kill it.
KILL_MID_WRITE = """
import os, signal, sys
from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
real = LocalArtifactRepository.log_artifact
def log_artifact(self, local_file, artifact_path=None):
    if local_file.endswith("last-b.pt"):
        folder = os.path.join(self.artifact_dir, artifact_path or "")
        os.makedirs(folder, exist_ok=True)
        data = open(local_file, "rb").read()
        with open(os.path.join(folder, "last-b.pt"), "wb") as f:
            f.write(data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, local_file, artifact_path)
LocalArtifactRepository.log_artifact = log_artifact
from accel.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigkill_during_a_checkpoint_write_leaves_the_previous_one_loadable(reference, tmp_path):
    """The killed process is real; the resume that reads what it left runs in this one, and
    ends as the run never stopped did."""
    ref_store, ref_run, _ = reference
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run([sys.executable, "-c", KILL_MID_WRITE, "train", *RESUMABLE,
                           "--tracking-uri", store], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    run_id = only_run(store)
    assert client(store).get_run(run_id).info.status == "RUNNING"  # nobody could end it

    out = run_in_process("resume", run_id, "--tracking-uri", store)
    assert out.returncode == 0, out.stderr
    assert "checkpoint/last-b.pt" in out.stderr and "skipped" in out.stderr  # the cut file
    assert "Traceback" not in out.stderr
    assert "after epoch 1 of 3" in out.stderr  # from the slot written before it
    assert client(store).get_run(run_id).info.status == "FINISHED"
    assert [s for s, _ in curves(store, run_id)["val_loss"]] == [1, 2, 3]
    assert curves(store, run_id) == curves(ref_store, ref_run)


def test_an_interrupted_write_leaves_the_file_it_replaces_whole(tmp_path, monkeypatch):
    path = tmp_path / "last-a.pt"
    checkpoint.save({"format": 1, "epoch": 1}, path)

    def broken_save(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        checkpoint.save({"format": 1, "epoch": 3}, path)
    monkeypatch.undo()
    assert checkpoint.load(path)["epoch"] == 1


class Payload:
    """Stands for anything a pickle could build (and run) on load."""


@pytest.mark.parametrize("damage", [pytest.param(b"epoch 2 weights, in words\n",
                                                 marks=pytest.mark.slow), os.urandom(4096)],
                         ids=["text", "random-bytes"])
def test_a_damaged_slot_is_skipped_and_the_other_one_resumed(damage, reference, tmp_path):
    """A slot holding something other than a checkpoint (a text file, random bytes): the resume
    says so in one line and carries on from the other slot, ending as the reference did. The
    run is stopped (and resumed) in this process: what is read is the slots."""
    ref_store, ref_run, _ = reference
    store = new_store(tmp_path)
    stopped = stopped_here_after(2, "train", *RESUMABLE, "--tracking-uri", store)
    assert stopped.returncode == 143, stopped.stderr
    run_id = only_run(store)
    damaged = tmp_path / "last-b.pt"  # epoch 2's slot; last-a.pt holds epoch 1
    damaged.write_bytes(damage)
    client(store).log_artifact(run_id, str(damaged), "checkpoint")

    out = run_in_process("resume", run_id, "--tracking-uri", store)
    assert out.returncode == 0, out.stderr
    assert f"run {run_id}: checkpoint/last-b.pt:" in out.stderr and "skipped" in out.stderr
    assert "Traceback" not in out.stderr
    assert "after epoch 1 of 3" in out.stderr
    assert client(store).get_run(run_id).info.status == "FINISHED"
    assert curves(store, run_id) == curves(ref_store, ref_run)


def test_a_checkpoint_holding_pickled_objects_is_refused(tmp_path):
    """Resume reads checkpoints with weights_only=True: a planted object is never built. The
    run is stopped (and the resume refused) in this process: what is read is the slot."""
    store = new_store(tmp_path)
    stopped = stopped_here_after(1, "train", *RESUMABLE, "--tracking-uri", store)
    assert stopped.returncode == 143, stopped.stderr
    run_id = only_run(store)
    planted = tmp_path / "last-a.pt"
    torch.save({"format": 1, "epoch": 99, "payload": Payload()}, planted)
    client(store).log_artifact(run_id, str(planted), "checkpoint")

    out = run_in_process("resume", run_id, "--tracking-uri", store)
    assert out.returncode == 2
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("accel: error: checkpoint ") and "last-a.pt" in line
    assert "refused (torch.load weights_only=True)" in line
    assert client(store).get_run(run_id).info.status == "KILLED"  # untouched


def interrupt(args: list[str], wait, sig: int, env: dict | None = None):
    """Start `accel ARGS` in its own session, wait until `wait()` answers, send `sig` to its
    whole process group: (what `wait` answered, the exit code, stderr)."""
    with open(os.devnull, "w") as quiet:
        proc = subprocess.Popen([sys.executable, "-m", "accel", *args], cwd=ROOT,
                                env={**os.environ, **(env or {})}, stdout=quiet,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        answer = wait()
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return answer, proc.returncode, err


# --- a trial whose worker died carries on from its checkpoint ---------------------------------


@pytest.mark.parametrize("storage_kind,sig", [("journal", signal.SIGKILL),
                                              pytest.param("sqlite", signal.SIGKILL,
                                                           marks=pytest.mark.slow),
                                              ("journal", signal.SIGTERM)])
def test_a_retried_trial_carries_on_from_the_dead_trials_checkpoint(storage_kind, sig, tmp_path,
                                                                     monkeypatch):
    """A worker killed with SIGKILL mid-trial: the next `accel tune` fails the trial (journal:
    its process is gone; database: its heartbeats stopped), queues it again with the same
    values, and the retry starts after the dead trial's last checkpointed epoch, in a new run
    that holds every epoch once. A trial stopped by SIGTERM (a preemption, a time limit) ends
    its run KILLED and is queued again by its own invocation; `accel resume` of its run is
    refused in one line (the study retries its own trials) and leaves it as it was; the next
    `accel tune` carries it on. The worker stopped is a real process; the next `accel tune`
    runs in this one."""
    store, storage, args, env = retried_study(tmp_path, storage_kind)
    dead_run, code, err = interrupt(args, lambda: wait_for_trial_epochs(store, 2), sig, env)
    assert code == (-sig if sig == signal.SIGKILL else 128 + sig), err[-3000:]
    dead_epochs = curves(store, dead_run)["val_loss"]
    time.sleep(3)  # past the grace period: the dead trial's heartbeat is stale
    if sig == signal.SIGTERM:
        stopped = study_trials(storage)
        assert [t.state.name for t in stopped] == ["FAIL", "WAITING"]  # queued by the stop
        assert "queued again" in client(store).get_run(dead_run).data.tags["accel.error"]
        a_study_trials_run_is_not_resumed(store, dead_run)

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = run_in_process(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    first, retry = study_trials(storage)
    assert (first.state.name, retry.state.name) == ("FAIL", "COMPLETE")
    assert retry.params == first.params
    assert retry.system_attrs["failed_trial"] == first.number
    run = client(store).get_run(retry.user_attrs["mlflow_run_id"])
    assert run.data.tags["accel.resumed_from"] == dead_run
    k = int(run.data.tags["accel.resumed_from_epoch"])
    assert k >= 2 and f"carries on after epoch {k} of run {dead_run}" in out.stderr
    assert client(store).get_run(dead_run).info.status == (
        "FAILED" if sig == signal.SIGKILL else "KILLED")
    mine = curves(store, run.info.run_id)["val_loss"]
    assert [s for s, _ in mine] == list(range(1, STUDY_EPOCHS + 1))  # every epoch once
    # The dead trial's epochs, carried over as they were. Its checkpoint of epoch k is written
    # before epoch k's metrics: a kill between the two leaves k - 1 epochs logged.
    assert len(dead_epochs) in (k - 1, k)
    assert mine[:len(dead_epochs)] == dead_epochs
    assert artifacts(store, run.info.run_id) == ["checkpoint/best.pt"]  # finished: slots gone
    assert "checkpoint/last-a.pt" in artifacts(store, dead_run)  # the dead run's are kept


def a_study_trials_run_is_not_resumed(store: str, run_id: str) -> None:
    """A trial's run belongs to its study, which retries it (Optuna's record and the run's tags
    stay in step): `accel resume` refuses it in one line and leaves the run as it was."""
    before, logged = client(store).get_run(run_id), curves(store, run_id)
    assert "checkpoint/last-a.pt" in artifacts(store, run_id)  # it could be carried on

    out = run_in_process("resume", run_id, "--tracking-uri", store)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"accel: error: run {run_id} is trial 0 of study r, and a study retries its own trials "
        "from their checkpoints: run `accel tune --study r` again with the study's config and "
        "storage"]
    after = client(store).get_run(run_id)
    assert (after.info.status, after.data.tags) == (before.info.status, before.data.tags)
    assert curves(store, run_id) == logged


# Enough for a kill after epoch 2 to land while the trial still trains; each one the retry
# carries on trains again.
STUDY_EPOCHS = 8


def retried_study(tmp_path: Path, storage_kind: str):
    """(MLflow store, Optuna storage, `accel tune` arguments, environment) of a one-trial study
    of STUDY_EPOCHS short epochs whose dead trials are retried within seconds."""
    import yaml

    exp = tmp_path / "retry.yaml"
    exp.write_text(yaml.safe_dump({
        "data": {"dataset": "digits", "num_workers": 0},
        "tracking": {"figures": False},
        "model": {"name": "test_resnet", "img_size": 16},
        "train": {"epochs": STUDY_EPOCHS, "epoch_length": 10, "batch_size": 16, "device": "cpu",
                  "amp": "off", "accumulation_steps": 4, "warmup_epochs": 1},
        "search": {"pruner": "none", "space": {
            "train.lr": {"type": "float", "low": 1.0e-3, "high": 2.0e-3}}},
    }))
    store = new_store(tmp_path)
    storage = (str(tmp_path / "optuna.journal") if storage_kind == "journal"
               else f"sqlite:///{tmp_path / 'optuna.db'}")
    args = ["tune", str(exp), "--study", "r", "--n-trials", "1", "--storage", storage,
            "--tracking-uri", store]
    return store, storage, args, {"ACCEL_HEARTBEAT_S": "1", "ACCEL_GRACE_S": "2"}


def study_trials(storage: str) -> list:
    import optuna

    return optuna.load_study(study_name="r", storage=(
        storage if storage.startswith("sqlite:") else
        optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage)))).trials


def test_a_retry_whose_config_no_longer_fits_the_checkpoint_starts_fresh(tmp_path):
    """The study rerun with another train.epochs after its trial was stopped: the retry cannot
    carry on from the stopped trial's checkpoint; it says so in one line and trains from epoch
    1, and the study goes on (no exit 2). A retry takes its checkpoint the same way whether its
    trial was stopped or its worker died (test_a_retried_trial_carries_on_from_the_dead_trials_
    checkpoint): both commands run in this process."""
    store, storage, args, _ = retried_study(tmp_path, "journal")
    stopped = stopped_here_after(1, *args)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert [t.state.name for t in study_trials(storage)] == ["FAIL", "WAITING"]
    c = client(store)
    [dead] = c.search_runs([e.experiment_id for e in c.search_experiments()],
                           "tags.`accel.role` = 'trial'")
    dead_run = dead.info.run_id

    out = run_in_process(*args, "train.epochs=4")
    assert out.returncode == 0, out.stderr[-3000:]
    first, retry = study_trials(storage)
    assert (first.state.name, retry.state.name) == ("FAIL", "COMPLETE")
    assert retry.params == first.params
    warnings = [line for line in out.stderr.splitlines() if "accel: warning: trial 1" in line]
    assert warnings == [
        f"accel: warning: trial 1: run {dead_run}: the checkpoint is of a run with "
        f"{STUDY_EPOCHS} epochs of 10 batches, this config has 4 of 10: the retry starts from "
        "epoch 1"], out.stderr
    run = client(store).get_run(retry.user_attrs["mlflow_run_id"])
    assert "accel.resumed_from" not in run.data.tags
    assert [s for s, _ in curves(store, run.info.run_id)["val_loss"]] == [1, 2, 3, 4]


def wait_for_trial_epochs(store: str, epochs: int, timeout_s: float = 120) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            c = client(store)
            runs = c.search_runs([e.experiment_id for e in c.search_experiments()],
                                 "tags.`accel.role` = 'trial'")
            if runs and len(c.get_metric_history(runs[0].info.run_id, "val_loss")) >= epochs:
                return runs[0].info.run_id
        except Exception:
            pass  # the store or the run is not there yet
        time.sleep(0.5)
    raise AssertionError(f"no trial run with {epochs} epochs within {timeout_s} s")


def test_a_run_with_every_fast_ingredient_resumed_inside_a_pass_ends_as_the_uninterrupted(
        tmp_path):
    """airbench's ingredients all on (whitening with its bias held after epoch 1, Dirac init,
    BatchNorm settings, the moving average, alternating flips, translate, multi-crop TTA), on
    resident images whose passes span epochs: stopped as SIGTERM stops it after epoch 2 (inside
    the second pass), `accel resume` in a new process ends with the curves and the best weights
    of the run never stopped. The reference and the stopped run train in this process: the
    resume's own process has nothing of theirs but the checkpoint."""
    from tests.conftest import make_imagefolder

    folder = make_imagefolder(tmp_path / "data", side=16, classes=3,
                              per_class={"train": 20, "test": 4})
    every = ["data.dataset=imagefolder", f"data.root={folder}", "data.val_fraction=0.1",
             "data.on_device=true", "data.flip=alternating", "data.translate=2",
             "model.name=accel_cnn_s", "model.whiten=2", "model.whiten_images=40",
             "model.dirac_init=true", "model.bn_momentum=0.4", "train.whiten_bias_epochs=1",
             "train.ema_decay=0.9", "train.bn_bias_lr_scale=64", "train.bn_weight_frozen=true",
             "eval.tta=multicrop", "train.optimizer=nesterov", "train.lr=0.05",
             "train.label_smoothing=0.2", "train.scheduler=linear", "train.epochs=3",
             "model.head_scale=0.111", "train.lr_start=0.2", "train.lr_end=0.07",
             "train.warmup_epochs=0.5",
             "train.batch_size=8", "train.epoch_length=4", "train.device=cpu",
             "tracking.system_metrics=false"]
    resumed, reference, said = stopped_and_resumed(every, 2, tmp_path, here=True)
    assert "after epoch 2 of 3" in said
    final = same_curves_and_weights(resumed, reference, 3, tmp_path)
    assert "whiten.weight" in final
