"""train.nproc_per_node: one run on two gloo processes, against one process at twice the
micro-batch; one MLflow run; a killed rank; a resumed two-rank run."""

from __future__ import annotations

import signal

import pytest
import torch
from mlflow.tracking import MlflowClient

from accel import config
from tests.conftest import new_store

# A model without BatchNorm (a ViT: LayerNorm is per image), so two ranks at micro-batch b and
# one process at 2b compute the same gradients; 256 digits, 16 px, no augmentation.
NO_BATCHNORM = (
    "data.dataset=digits",
    "data.train_limit=256",
    "data.num_workers=0",
    "model.name=test_vit",
    "model.img_size=16",
    "train.epochs=2",
    "train.device=cpu",
    "train.amp=off",
    "train.optimizer=sgd",
    "train.lr=0.05",
    "train.clip_grad_norm=1.0",
    "tracking.system_metrics=false",
)


def built(monkeypatch) -> list:
    """Every run's parts (model, history, ...) that train() builds in this process (rank 0)."""
    import accel.train as training

    kept, build = [], training.build

    def build_and_keep(cfg, *args):
        parts = build(cfg, *args)
        kept.append(parts)
        return parts

    monkeypatch.setattr(training, "build", build_and_keep)
    return kept


def trained(overrides: list[str], store: str, monkeypatch) -> tuple[object, torch.nn.Module]:
    """train() in this process (rank 0), and the model it trained."""
    from accel.train import train

    parts = built(monkeypatch)
    result = train(config.load(None, [*NO_BATCHNORM, *overrides, f"tracking.uri={store}"]))
    return result, parts[-1].bare


@pytest.mark.parametrize(("accumulation", "on_device"),
                         [(1, False), pytest.param(2, False, marks=pytest.mark.slow),
                          pytest.param(2, True, marks=pytest.mark.slow)],
                         ids=["loader", "loader-accumulated", "resident-accumulated"])
def test_two_ranks_at_b_train_the_weights_one_process_trains_at_2b(accumulation, on_device,
                                                                    tmp_path, monkeypatch):
    store = new_store(tmp_path)
    same = [f"train.accumulation_steps={accumulation}", f"data.on_device={on_device}"]
    one, one_model = trained(["train.batch_size=16", *same], store, monkeypatch)
    two, two_model = trained(["train.batch_size=8", *same, "train.nproc_per_node=2",
                              "tracking.experiment=two"], store, monkeypatch)
    for name, weight in one_model.state_dict().items():
        other = two_model.state_dict()[name]
        assert torch.allclose(weight, other, rtol=0, atol=1e-5), (
            name, (weight - other).abs().max())
    assert one.history[0]["val_accuracy"] == two.history[0]["val_accuracy"]  # the same images
    for a, b in zip(one.history, two.history, strict=True):
        for key in ("train_loss", "val_loss", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), (key, a[key], b[key])
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("two").experiment_id])
    assert len(runs) == 1, "one MLflow run for the two ranks"
    assert runs[0].info.run_id == two.run_id and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["train.nproc_per_node"] == "2"
    assert runs[0].data.params["effective_batch_size"] == str(16 * accumulation)


def _done_then_aborting_teardown(leave: bool) -> None:
    """A follower's last steps, whose interpreter teardown aborts, as a C++ thread still joinable
    when it is destroyed does ('terminate called without an active exception')."""
    import atexit
    import os
    import resource

    from accel.train import launch

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the abort leaves no core file
    atexit.register(os.abort)
    print("follower done", flush=False)
    if leave:
        launch.leave(0)


@pytest.mark.parametrize("leave", [True, False])
def test_a_follower_that_finished_is_not_failed_by_its_teardown(leave, capfd):
    """A follower ends by launch.leave: its output flushed, the teardown skipped, exit code 0.
    Left to the interpreter's exit, the same follower ends killed by SIGABRT, which rank 0 reads
    as a failed rank (what CI saw once, after both ranks had trained)."""
    import multiprocessing

    follower = multiprocessing.get_context("spawn").Process(
        target=_done_then_aborting_teardown, args=(leave,))
    follower.start()
    follower.join(timeout=120)
    assert follower.exitcode == (0 if leave else -signal.SIGABRT)
    assert "follower done" in capfd.readouterr().out


def test_a_killed_rank_ends_the_run_failed_naming_it(tmp_path, capfd):
    """SIGKILL to rank 1 once an epoch is logged (rank 0 is this process, its follower a real
    one): rank 0 says which rank ended and how, in one line, exit 1, and the run is FAILED; no
    process is left, and the follower printed nothing."""
    import threading
    import time

    import psutil

    from tests.conftest import cli_main

    store = new_store(tmp_path)
    client = MlflowClient(store)
    capfd.readouterr()  # the store's own lines: what follows is the follower's
    here = psutil.Process()
    before = {p.pid for p in here.children()}
    done, seen = threading.Event(), {}

    def followers() -> list:  # not the resource tracker that spawn starts
        found = []
        for p in here.children():
            try:
                if p.pid not in before and "spawn_main" in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.Error:  # gone between the listing and the look
                pass
        return found

    def kill_the_follower_once_both_ranks_train(timeout_s: float = 600) -> None:
        deadline = time.time() + timeout_s
        while not done.is_set() and time.time() < deadline:
            time.sleep(0.2)
            try:  # an epoch logged: both ranks are training
                runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
                epoch = runs and client.get_metric_history(runs[0].info.run_id, "val_loss")
            except Exception:  # the run is not there yet
                continue
            if epoch and (found := followers()):
                seen["follower"] = found[0]
                found[0].send_signal(signal.SIGKILL)
                return
        for p in followers():  # no epoch in time: end the run all the same, the test fails
            p.send_signal(signal.SIGKILL)

    killer = threading.Thread(target=kill_the_follower_once_both_ranks_train, daemon=True)
    killer.start()
    try:
        code, _, err = cli_main("train", *NO_BATCHNORM, "train.epochs=200", "train.batch_size=8",
                                "--nproc-per-node", "2", "--tracking-uri", store)
    finally:
        done.set()
        killer.join()
    assert "follower" in seen, f"no follower with an epoch logged; exit {code}:\n{err[-3000:]}"
    assert code == 1, err[-3000:]
    *epochs, last = err.strip().splitlines()  # a log, not a terminal: a line an epoch before it
    assert "rank 1 of 2 ended (killed by SIGKILL)" in last, err[-3000:]
    assert epochs and all(line.startswith("epoch ") for line in epochs), err[-3000:]
    assert not capfd.readouterr().err.strip(), "the follower printed"
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    follower = seen["follower"]
    assert not psutil.pid_exists(follower.pid) or follower.status() == psutil.STATUS_ZOMBIE


# make test covers it: a stop and resume across ranks: one rank's in tests/test_resume.py, ranks in
# this file's others
@pytest.mark.slow
def test_a_two_rank_run_stopped_by_sigterm_resumes_exactly(tmp_path):
    """Processes as users run them: a two-rank run never interrupted; the same run with SIGTERM
    to rank 0 after epoch 1 (inside a pass over the data), which ends its follower too and
    leaves the run KILLED; `accel resume` of it, on two ranks again, ends with the same curves
    and weights."""
    from tests.test_resume import RESUMABLE, same_curves_and_weights, stopped_and_resumed

    two = [*RESUMABLE, "train.batch_size=8", "train.nproc_per_node=2"]
    resumed, reference, said = stopped_and_resumed(two, 1, tmp_path)
    assert "after epoch 1 of 3" in said
    same_curves_and_weights(resumed, reference, 3, tmp_path)


def test_a_study_of_two_rank_trials_logs_one_run_per_trial(tmp_path):
    """`accel tune --nproc-per-node 2`: each trial trains on two ranks (rank 0 is the study's
    process), logs one MLflow run, and its value is that run's best val_accuracy."""
    import optuna
    import yaml

    from accel.tune.storage import open_storage
    from tests.conftest import cli_main

    exp = tmp_path / "ddp.yaml"
    overrides = dict(item.split("=", 1) for item in NO_BATCHNORM)
    data = {"name": "ddp", "search": {"pruner": "none", "space": {
        "train.lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True}}}}
    for key, value in overrides.items():
        section, name = key.split(".")
        data.setdefault(section, {})[name] = value if value == "off" else yaml.safe_load(value)
    data["train"].update(epochs=1, batch_size=8)
    exp.write_text(yaml.safe_dump(data))
    store, journal = new_store(tmp_path), str(tmp_path / "optuna.journal")
    code, _, err = cli_main("tune", str(exp), "--n-trials", "2", "--nproc-per-node", "2",
                            "--storage", journal, "--tracking-uri", store)
    assert code == 0, err[-3000:]
    trials = optuna.load_study(study_name="ddp", storage=open_storage(journal)).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("ddp").experiment_id],
                              "tags.`accel.role` = 'trial'")
    assert len(runs) == 2, "one run per trial, not per rank"
    by_id = {r.info.run_id: r for r in runs}
    for trial in trials:
        run = by_id[trial.user_attrs["mlflow_run_id"]]
        assert trial.value == run.data.metrics["best_val_accuracy"]
        assert run.data.params["train.nproc_per_node"] == "2"


def test_rank_zeros_pruning_ends_every_rank(tmp_path, monkeypatch):
    """Only rank 0 holds the Optuna trial: when it prunes after epoch 2, the follower stops at
    the same epoch (no rank left waiting in a collective), train() raises TrialPruned and the
    run ends KILLED, as a pruned one-process trial's does."""
    import types

    import optuna
    import optuna_integration
    import psutil

    import accel.train as training

    class PruneAtEpochTwo:
        def __init__(self, trial, metric, trainer):
            self.trainer = trainer

        def __call__(self, evaluator):
            if self.trainer.state.epoch == 2:
                raise optuna.TrialPruned("pruned at epoch 2")

    monkeypatch.setattr(optuna_integration, "PyTorchIgnitePruningHandler", PruneAtEpochTwo)
    trial = types.SimpleNamespace(study=types.SimpleNamespace(directions=["maximize"]))
    parts = built(monkeypatch)
    from accel.train import launch

    ended, end = [], launch._end

    def end_and_record(followers):  # how each follower ended before rank 0 would end it
        ended.extend(p.exitcode for p in followers)
        end(followers)

    monkeypatch.setattr(launch, "_end", end_and_record)
    store = new_store(tmp_path)
    cfg = config.load(None, [*NO_BATCHNORM, "train.epochs=4", "train.batch_size=8",
                             "train.nproc_per_node=2", f"tracking.uri={store}"])
    with pytest.raises(optuna.TrialPruned):
        training.train(cfg, trial=trial)
    assert len(parts[0].history) == 2
    assert ended == [0], "the follower did not stop by itself with rank 0's decision"
    client = MlflowClient(store)
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "KILLED"
    assert len(client.get_metric_history(run.info.run_id, "val_loss")) == 2
    assert not [p for p in psutil.Process().children(recursive=True)
                if "spawn_main" in " ".join(p.cmdline())], "a follower was left running"


# make test covers it: resume in tests/test_resume.py, ranks in this file's other tests
@pytest.mark.slow
def test_a_resumed_two_rank_run_whose_best_epoch_came_before_scores_it_on_every_rank(tmp_path):
    """The best epoch (the lowest val_accuracy here) ran before the stop: after `accel resume`
    only rank 0 can read its best.pt from the store, and every rank must score the same weights
    (the final evaluation is one collective over the ranks' shards)."""
    from tests.conftest import run_cli
    from tests.test_resume import RESUMABLE, only_run, train_stopped_after

    two = [*RESUMABLE, "train.batch_size=8", "train.nproc_per_node=2",
           "search.direction=minimize"]
    store = new_store(tmp_path)
    stopped = train_stopped_after(2, [*two, "--tracking-uri", store])
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    run_id = only_run(store)
    out = run_cli("resume", run_id, "--tracking-uri", store, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "scored with the last epoch's weights" not in out.stderr
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["best_epoch"] < 3


def test_under_torchrun_rank_zero_logs_the_run_its_world_size_trained(tmp_path):
    """`torchrun --nproc-per-node 2 -m accel train ...`: the ranks exist already; one MLflow run,
    torchrun's world size logged as train.nproc_per_node (so the effective batch is 2 x 8), one
    summary printed, and the same curve as one process at batch 16."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import ROOT, cli_main

    store = new_store(tmp_path)
    code, _, err = cli_main("train", *NO_BATCHNORM, "train.batch_size=16",
                            "tracking.experiment=one", "--tracking-uri", store)
    assert code == 0, err[-3000:]
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "accel", "train",
         *NO_BATCHNORM, "train.batch_size=8", "tracking.experiment=torchrun",
         "--tracking-uri", store],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [line.split(":")[0] for line in out.stdout.splitlines()] == [
        f"run {run.info.run_id}" for run in MlflowClient(store).search_runs(
            [MlflowClient(store).get_experiment_by_name("torchrun").experiment_id])]
    client = MlflowClient(store)

    def only(experiment):
        [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        return run, [m.value for m in client.get_metric_history(run.info.run_id, "val_loss")]

    (run, logged), (_, expected) = only("torchrun"), only("one")
    assert run.info.status == "FINISHED"
    assert run.data.params["train.nproc_per_node"] == "2"
    assert run.data.params["effective_batch_size"] == "16"
    assert len(logged) == 2 and logged == pytest.approx(expected, rel=1e-5)


def test_under_torchrun_a_different_nproc_and_tune_are_refused(monkeypatch):
    from tests.conftest import cli_main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    code, _, err = cli_main("train", *NO_BATCHNORM, "--nproc-per-node", "4")
    assert code == 2 and "train.nproc_per_node=4 but torchrun started 2 ranks" in err, err
    code, _, err = cli_main("tune", *NO_BATCHNORM)
    assert code == 2 and "run it without torchrun, with --nproc-per-node N" in err, err
