"""`train(cfg)` end to end on CPU: determinism, what MLflow holds, FAILED and KILLED runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
import yaml

from accel import config
from accel.train import NonFiniteLoss, train
from tests.conftest import ROOT, make_imagefolder, run_in_process

CURVES = (
    "train_loss",
    "val_loss",
    "val_accuracy",
    "val_f1",
    "epoch_time_s",
    "train_throughput",
    "lr",
    "peak_memory_mb",
)
TIMINGS = ("epoch_time_s", "train_throughput", "peak_memory_mb")


def runs_in(store: str, experiment: str):
    client = mlflow.MlflowClient(tracking_uri=store)  # a fresh client, as a user would
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


def test_same_seed_twice_gives_identical_metrics(tiny_overrides):
    cfg = config.load(None, [*tiny_overrides, "train.accumulation_steps=2"])
    a, b = train(cfg, track=False), train(cfg, track=False)
    strip = lambda h: [{k: v for k, v in row.items() if k not in TIMINGS} for row in h]  # noqa: E731
    assert strip(a.history) == strip(b.history)
    assert len(a.history) == 2
    other = train(
        config.load(None, [*tiny_overrides, "train.accumulation_steps=2", "train.seed=1"]),
        track=False,
    )
    assert strip(other.history) != strip(a.history)  # the seed is really used


def test_a_runs_model_is_freed_once_the_next_run_starts(tiny_overrides, store, monkeypatch):
    """A study trains many runs in one process, and each run leaves objects behind in reference
    cycles (the trainer's handlers hold the model): train() collects them before it puts what
    survives out of the collector's reach (gc.freeze), so no run keeps an earlier one's model."""
    import gc
    import weakref

    import accel.train as training

    models, build = [], training.build

    def build_and_watch(cfg, *args):
        parts = build(cfg, *args)
        models.append(weakref.ref(parts.bare))
        return parts

    monkeypatch.setattr(training, "build", build_and_watch)
    cfg = config.load(None, [*tiny_overrides, "train.epochs=1", f"tracking.uri={store}"])
    gc.disable()  # only train()'s own collections run
    try:
        train(cfg)
        assert models[0]() is not None, "freed by reference counts alone: nothing to show"
        train(cfg)
    finally:
        gc.enable()
    assert len(models) == 2
    assert models[0]() is None, "the first run's model outlived the second run's start"
    gc.collect()
    assert models[1]() is None

def test_train_cli_logs_the_contract(tiny_overrides, store, tmp_path):
    proc = run_in_process(
        "train",
        *tiny_overrides,
        "train.clip_grad_norm=1.0",
        "tracking.figures=true",
        "--tracking-uri",
        store,
        "--experiment",
        "contract",
    )
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.split()[1].rstrip(":")

    client = mlflow.MlflowClient(tracking_uri=store)  # a fresh client, as a user would
    runs = runs_in(store, "contract")
    assert [r.info.run_id for r in runs] == [run_id]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["accel.role"] == "train"

    cfg = config.load(
        ROOT / config.DEFAULT_CONFIG,
        [*tiny_overrides, "train.clip_grad_norm=1.0", "tracking.figures=true",
         "tracking.experiment=contract"],
    )
    assert run.data.params["tracking.uri"] == "null"  # never the store URL (may hold a password)
    for key, value in cfg.flat().items():  # the whole resolved config, not just a few keys
        assert run.data.params[key] == ("null" if value is None else str(value)), key
    assert run.data.params["effective_batch_size"] == "16"

    for name in CURVES:
        history = client.get_metric_history(run_id, name)
        assert [m.step for m in history] == [1, 2], name
    accuracy = [m.value for m in client.get_metric_history(run_id, "val_accuracy")]
    best = int(run.data.metrics["best_epoch"])
    assert accuracy[best - 1] == max(accuracy) == run.data.metrics["best_val_accuracy"]

    # Where each epoch's time went and its MFU against the peak measured here (accel.timing).
    for name in ("time_data_s", "time_copy_s", "time_compute_s", "time_eval_s", "time_record_s",
                 "time_other_s", "epoch_wall_s", "achieved_tflops", "mfu"):
        assert [m.step for m in client.get_metric_history(run_id, name)] == [1, 2], name
    assert 0 < run.data.metrics["mfu"] <= 1
    assert float(run.data.params["resolved.flops_per_image"]) > 0
    peak = [m.value for m in client.get_metric_history(run_id, "peak_tflops")]
    assert peak and peak[-1] >= run.data.metrics["achieved_tflops"]  # measured again if outrun
    assert run.data.tags["accel.peak"] in ("measured", "cached", "achieved")

    top = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "environment.json", "confusion_matrix.png", "time_split.png",
            "checkpoint"} <= top
    local = Path(client.download_artifacts(run_id, "", str(tmp_path / "art")))
    assert config.from_dict(yaml.safe_load((local / "config.yaml").read_text())) == cfg
    env = yaml.safe_load((local / "environment.json").read_text())
    assert env["torch"] == torch.__version__ and env["seed"] == 0 and "git_commit" in env
    assert isinstance(env["torch_threads"], int) and env["torch_threads"] >= 1
    assert set(env["thread_env"]) >= {"OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS"}
    expected_tf32 = ({"matmul": True, "cudnn": True} if torch.cuda.is_available()
                     else "no CUDA")  # train.tf32 (on by default) where CUDA is present
    assert env["tf32"] == expected_tf32 and run.data.params["train.tf32"] == "True"
    state = torch.load(local / "checkpoint" / "best.pt", weights_only=True)
    assert "fc.weight" in state and state["fc.weight"].shape[0] == 10


def test_nan_loss_ends_failed(tiny_overrides, store):
    proc = run_in_process(
        "train",
        *tiny_overrides,
        "train.optimizer=sgd",
        "train.lr=1e12",
        "--tracking-uri",
        store,
        "--experiment",
        "nan",
    )
    assert proc.returncode == 1
    assert "loss became" in proc.stderr and "Traceback" not in proc.stderr
    runs = runs_in(store, "nan")
    assert [r.info.status for r in runs] == ["FAILED"]


def test_nan_loss_raises_in_process(tiny_overrides):
    cfg = config.load(None, [*tiny_overrides, "train.optimizer=sgd", "train.lr=1e12"])
    with pytest.raises(NonFiniteLoss):
        train(cfg, track=False)


@pytest.mark.parametrize("ending", ["finished", "failed"])
def test_a_run_stops_its_loader_workers_when_it_ends(tiny_overrides, ending, monkeypatch):
    """A study or an ablation trains again in the same process. The run's persistent loader
    workers end with the run; left to the garbage collector (off here, as it is between two
    of its passes), they outlived it and then cost torch's 5 s join timeout each."""
    import gc
    import multiprocessing

    overrides = [*tiny_overrides, "data.num_workers=1"]
    if ending == "failed":
        overrides += ["train.optimizer=sgd", "train.lr=1e12"]
    before = set(multiprocessing.active_children())
    monkeypatch.setattr(gc, "collect", lambda *a: 0)  # train() collects before it builds
    gc.disable()
    try:
        if ending == "failed":
            with pytest.raises(NonFiniteLoss):
                train(config.load(None, overrides), track=False)
        else:
            assert len(train(config.load(None, overrides), track=False).history) == 2
        left = set(multiprocessing.active_children()) - before
    finally:
        gc.enable()
    assert left == set(), f"loader workers still running after the run: {left}"


def test_ctrl_c_ends_killed(tiny_overrides, store, monkeypatch):
    from accel import engine

    real = engine.UpdateStep.update
    calls = {"n": 0}

    def interrupted(self):
        calls["n"] += 1
        if calls["n"] == 8:  # in the second epoch (6 updates per epoch)
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(engine.UpdateStep, "update", interrupted)
    cfg = config.load(None, [*tiny_overrides, f"tracking.uri={store}", "tracking.experiment=ctrlc"])
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    runs = runs_in(store, "ctrlc")
    assert [r.info.status for r in runs] == ["KILLED"]
    history = mlflow.MlflowClient(store).get_metric_history(runs[0].info.run_id, "val_accuracy")
    assert [m.step for m in history] == [1]  # the finished epoch stays logged


def test_every_run_logs_its_config_without_the_store_url(store, tmp_path):
    """Tracker.log_config, used by train, trial, study, ablation and reproduce runs, never logs
    where the run is stored (a store URL may hold a password)."""
    from accel.tracking import Tracker

    cfg = config.load(None, ["tracking.uri=postgresql://someone:s3cret-pw@db.example/mlflow"])
    tracker = Tracker(store)
    run_id = tracker.start_run("logged", "config-only")
    tracker.log_config(run_id, cfg, {"extra.value": 3})
    run = mlflow.MlflowClient(store).get_run(run_id)
    assert run.data.params["tracking.uri"] == "null" and run.data.params["extra.value"] == "3"
    assert not [v for v in run.data.params.values() if "s3cret-pw" in v]
    text = Path(mlflow.MlflowClient(store).download_artifacts(run_id, "config.yaml", str(tmp_path)))
    assert "s3cret-pw" not in text.read_text()
    assert config.from_dict(yaml.safe_load(text.read_text())).tracking.uri is None
    assert cfg.tracking.uri.startswith("postgresql://")  # the caller's config is left as it was


def test_a_run_that_fails_while_logging_its_config_ends_failed(tiny_overrides, store, monkeypatch):
    from accel.tracking import Tracker

    def broken(self, run_id, obj, artifact_file):
        raise OSError(f"[Errno 28] No space left on device: '{artifact_file}'")

    monkeypatch.setattr(Tracker, "log_json", broken)
    cfg = config.load(None, [*tiny_overrides, f"tracking.uri={store}",
                             "tracking.experiment=broken"])
    with pytest.raises(OSError, match="No space left"):
        train(cfg)
    assert [r.info.status for r in runs_in(store, "broken")] == ["FAILED"]


def test_a_store_error_at_the_end_does_not_hide_the_runs_own_error(tiny_overrides, store,
                                                                   monkeypatch):
    from accel.tracking import Tracker

    def unreachable(self, run_id, status):
        raise ConnectionError("store unreachable")

    monkeypatch.setattr(Tracker, "end_run", unreachable)
    cfg = config.load(None, [*tiny_overrides, "train.optimizer=sgd", "train.lr=1e12",
                             f"tracking.uri={store}", "tracking.experiment=hidden"])
    with pytest.raises(NonFiniteLoss):  # not ConnectionError
        train(cfg)


def test_best_epoch_follows_the_search_metric_and_direction():
    from accel.train import find_best_epoch as best_epoch

    history = [{"val_accuracy": 0.7, "val_loss": 0.9}, {"val_accuracy": 0.9, "val_loss": 0.4},
               {"val_accuracy": 0.9, "val_loss": 0.5}, {"val_accuracy": 0.8, "val_loss": 0.3}]
    assert best_epoch(history, "val_accuracy", "maximize") == 2  # a tie: the earlier epoch
    assert best_epoch(history, "val_loss", "minimize") == 4
    assert best_epoch([], "val_loss", "minimize") == 0


def test_a_trial_reports_its_best_epoch_the_one_checkpointed(tmp_path, monkeypatch):
    """A trial's value is its best epoch's metric, not the last epoch's: the same epoch whose
    weights checkpoint/best.pt holds."""
    import optuna

    import accel.train as T
    from accel import tune

    history = [{"val_accuracy": 0.9}, {"val_accuracy": 0.5}]
    monkeypatch.setattr(T, "train", lambda cfg, **kw: T.Result(
        None, dict(history[-1]), history, 2, 1.0, best_epoch=T.find_best_epoch(
            history, "val_accuracy", "maximize")))
    exp = tmp_path / "best.yaml"
    exp.write_text(yaml.safe_dump({"search": {"space": {
        "train.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2}}}}))
    storage = str(tmp_path / "optuna.journal")
    from accel.cli import main

    assert main(["tune", str(exp), "--study", "best", "--n-trials", "1", "--storage", storage,
                 "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 0
    study = optuna.load_study(study_name="best", storage=tune.open_storage(storage))
    assert study.trials[0].value == 0.9


def test_an_error_in_an_epoch_handler_is_not_swallowed(tiny_overrides, store, monkeypatch):
    """Ignite runs accel's per-epoch work in handlers: an error there ends the run FAILED and
    reaches the caller as itself (the CLI keeps a bug's traceback), never a silent stop."""
    import accel.train.epochs as epochs

    def broken(parts, t0):
        raise ZeroDivisionError("a bug inside the epoch handler")

    monkeypatch.setattr(epochs, "epoch_row", broken)
    cfg = config.load(None, [*tiny_overrides, f"tracking.uri={store}",
                             "tracking.experiment=handler"])
    with pytest.raises(ZeroDivisionError, match="inside the epoch handler"):
        train(cfg)
    [run] = runs_in(store, "handler")
    assert run.info.status == "FAILED"


def _inputs(store: str, experiment: str) -> dict[str, tuple[str, str, dict]]:
    import json

    [run] = runs_in(store, experiment)
    return {i.dataset.name: (i.tags[0].value, i.dataset.digest, json.loads(i.dataset.profile))
            for i in run.inputs.dataset_inputs}


HELD = {"dataloader": [], "in_memory": ["data.in_memory=true"],
        "on_device": ["data.on_device=true"]}  # the three ways a run holds its images


def inverted_copy(src: Path, dst: Path) -> Path:
    """The same tree (names, file sizes, labels) with every pixel inverted: other images."""
    import numpy as np
    from PIL import Image

    for path in sorted(src.rglob("*.png")):
        out = dst / path.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(255 - np.asarray(Image.open(path))).save(out)
    return dst


def test_every_run_logs_which_data_it_saw(tiny_overrides, store, tiny_imagefolder, tmp_path):
    """One MLflow dataset input per split, with its context, size, classes and a digest of the
    very samples: the same data gives the same digest whichever way it is held (read from files,
    in memory, on the device); another split, or a folder of the same layout with other pixels,
    another one."""
    def run(experiment: str, *extra: str):
        cfg = config.load(None, [*tiny_overrides, "train.epochs=1", f"tracking.uri={store}",
                                 "tracking.system_metrics=false", "tracking.log_checkpoint=false",
                                 f"tracking.experiment={experiment}", *extra])
        train(cfg)
        return _inputs(store, experiment)

    a, again, other = run("a"), run("again"), run("other", "data.val_fraction=0.2")
    assert {name: (context, profile["samples"]) for name, (context, _, profile) in a.items()} \
        == {"digits-train": ("training", 1617), "digits-val": ("validation", 180)}
    assert a["digits-val"][2]["classes"] == [str(i) for i in range(10)]
    assert again == a
    assert other["digits-val"][1] != a["digits-val"][1]

    def digests(root: Path, held: str) -> dict[str, str]:
        inputs = run(f"{root.name}-{held}", "data.dataset=imagefolder", f"data.root={root}",
                     "model.img_size=32", "train.epoch_length=1", *HELD[held])
        assert inputs["imagefolder-test"][0] == "testing"
        return {name: digest for name, (_, digest, _) in inputs.items()}

    inverted = inverted_copy(tiny_imagefolder, tmp_path / "inverted")
    ours = {held: digests(tiny_imagefolder, held) for held in HELD}
    theirs = {held: digests(inverted, held) for held in HELD}
    assert set(ours["dataloader"]) == {"imagefolder-train", "imagefolder-val", "imagefolder-test"}
    assert ours["in_memory"] == ours["dataloader"] == ours["on_device"]
    assert theirs["in_memory"] == theirs["dataloader"] == theirs["on_device"]
    for split, digest in ours["dataloader"].items():
        assert theirs["dataloader"][split] != digest, split


def test_system_metrics_are_sampled_while_a_run_trains(tiny_overrides, store, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")  # default 10 s
    # 4 epochs give the sampler time to sample; the unwatched run only shows none is taken
    for experiment, on, epochs in (("watched", "true", 4), ("unwatched", "false", 1)):
        cfg = config.load(None, [*tiny_overrides, f"train.epochs={epochs}", f"tracking.uri={store}",
                                 f"tracking.experiment={experiment}",
                                 f"tracking.system_metrics={on}"])
        train(cfg)
    [watched], [unwatched] = runs_in(store, "watched"), runs_in(store, "unwatched")
    sampled = {k for k in watched.data.metrics if k.startswith("system/")}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= sampled
    assert not [k for k in unwatched.data.metrics if k.startswith("system/")]
    assert watched.info.status == "FINISHED"
    # tracking.figures=false (the tiny runs'): no figure drawn (the contract test has both)
    logged = {a.path for a in mlflow.MlflowClient(store).list_artifacts(watched.info.run_id)}
    assert "config.yaml" in logged and not logged & {"confusion_matrix.png", "time_split.png"}


@pytest.fixture(scope="module")
def gray_imagefolder(tmp_path_factory) -> Path:
    """An ImageFolder unlike the quickstart's digits: 28x28 grayscale PNGs, 3 classes."""
    return make_imagefolder(tmp_path_factory.mktemp("gray"), side=28, classes=3,
                            per_class={"train": 8, "test": 2}, gray=True)


@pytest.mark.parametrize("in_memory", ["false", "true"])
def test_new_data_on_the_command_line_brings_its_own_size_and_channels(
        gray_imagefolder, store, in_memory):
    """The default config (the quickstart: digits at 8 px) with another data set on the command
    line: the model is built for 28 px, 1 channel, and one line says what was not kept."""
    short = ["train.epochs=1", "train.epoch_length=2", "train.batch_size=8", "train.device=cpu",
             f"data.in_memory={in_memory}", "tracking.system_metrics=false"]
    proc = run_in_process("train", "data.dataset=imagefolder", f"data.root={gray_imagefolder}",
                          *short, "--tracking-uri", store, "--experiment", "gray")
    assert proc.returncode == 0, proc.stderr[-2000:]
    [line] = [ln for ln in proc.stderr.splitlines() if "model.img_size" in ln]
    assert "model.img_size=8 from experiments/quickstart.yaml" in line
    assert "data.dataset=digits" in line
    [run] = runs_in(store, "gray")
    params = run.data.params
    assert (params["resolved.img_size"], params["resolved.in_chans"]) == ("28", "1")
    assert params["resolved.num_classes"] == "3" and params["model.img_size"] == "null"
    assert int(params["resolved.threads"]) >= 1

    chosen = run_in_process("train", "data.dataset=imagefolder", f"data.root={gray_imagefolder}",
                            "model.img_size=16", *short, "--tracking-uri", store,
                            "--experiment", "g16")
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert "model.img_size" not in chosen.stderr
    [run] = runs_in(store, "g16")
    assert run.data.params["resolved.img_size"] == "16"


def test_a_run_on_other_data_goes_to_its_own_experiment(gray_imagefolder, store):
    """The quickstart's file on another folder: not among the digits runs; one line says where."""
    proc = run_in_process("train", "data.dataset=imagefolder", f"data.root={gray_imagefolder}",
                          "train.epochs=1", "train.epoch_length=2", "train.batch_size=8",
                          "train.device=cpu", "tracking.system_metrics=false",
                          "--tracking-uri", store)
    assert proc.returncode == 0, proc.stderr[-2000:]
    name = f"quickstart-{gray_imagefolder.name}"
    [line] = [ln for ln in proc.stderr.splitlines() if "runs and studies go under" in ln]
    assert f"is not the data of quickstart.yaml: runs and studies go under the name {name}" in line
    assert len(runs_in(store, name)) == 1
    assert runs_in(store, "quickstart") == []


@pytest.fixture(scope="module")
def digits_imagefolder(tmp_path_factory) -> Path:
    """scikit-learn's digits as an ImageFolder with a test split: data a few epochs learn."""
    from PIL import Image

    from accel.data import load_digits_arrays

    images, labels = load_digits_arrays()
    root = tmp_path_factory.mktemp("digits_folder")
    for i, (image, label) in enumerate(zip(images[:600], labels[:600], strict=True)):
        folder = root / ("train" if i < 480 else "test") / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((image * 15).astype("uint8"), mode="L").save(folder / f"{i}.png")
    return root


def test_test_metrics_describe_the_weights_best_pt_holds(digits_imagefolder, store):
    """test_* are scored with the best epoch's weights, the ones a logged, registered or served
    model carries: `accel evaluate` of the run's model gives the run's own test numbers. The
    best epoch is made the first (the highest val_loss) so that it is not the last."""
    proc = run_in_process("train", "data.dataset=imagefolder", f"data.root={digits_imagefolder}",
                          "model.name=test_resnet", "model.img_size=16", "train.epochs=3",
                          "train.batch_size=32", "train.device=cpu", "train.amp=off",
                          "search.metric=val_loss", "search.direction=maximize",
                          "tracking.log_model=true", "tracking.system_metrics=false",
                          "--tracking-uri", store, "--experiment", "bestw")
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run] = runs_in(store, "bestw")
    metrics = run.data.metrics
    assert metrics["best_epoch"] == 1, "the check needs a best epoch before the last"
    assert "best_epoch=1 best_val_loss=" in proc.stdout  # the closing line names it
    evaluated = run_in_process("evaluate", f"runs:/{run.info.run_id}/model",
                               "--tracking-uri", store)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    [evaluation] = [r for r in runs_in(store, "bestw") if r.data.tags["accel.role"] == "evaluate"]
    assert evaluation.data.metrics["images"] == 120
    assert evaluation.data.metrics["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert evaluation.data.metrics["test_loss"] == pytest.approx(metrics["test_loss"], rel=1e-4)


def test_an_epoch_of_few_updates_says_so_and_what_is_left_out(store, monkeypatch):
    """115 images at the default batch of 64: one update an epoch, 51 images left out."""
    from accel.train import parts

    monkeypatch.setattr(parts, "_said", set())  # said once per process: this test's process
    proc = run_in_process("train", "data.dataset=digits", "data.train_limit=115",
                          "model.name=test_resnet", "train.epochs=1", "train.device=cpu",
                          "tracking.system_metrics=false", "--tracking-uri", store,
                          "--experiment", "few")
    assert proc.returncode == 0, proc.stderr[-2000:]
    [line] = [ln for ln in proc.stderr.splitlines() if "an epoch is" in ln]
    assert line == ("accel: an epoch is 1 update(s) (115 training images, train.batch_size=64); "
                    "the last 51 image(s) of each shuffled pass are left out (a different few "
                    "each epoch), so that every update has a full batch; a smaller "
                    "train.batch_size gives more updates")
    quiet = run_in_process("train", "data.dataset=digits", "data.train_limit=115",
                           "model.name=test_resnet", "train.epochs=1", "train.device=cpu",
                           "train.batch_size=8", "tracking.system_metrics=false",
                           "--tracking-uri", store, "--experiment", "few")
    assert quiet.returncode == 0 and "an epoch is" not in quiet.stderr, quiet.stderr[-2000:]


def test_a_config_file_for_the_data_keeps_its_image_size(tmp_path):
    """Only a dataset changed on the command line lets the file's model.img_size go."""
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"data": {"dataset": "imagefolder", "root": "/x"},
                                    "model": {"img_size": 24}}))
    assert config.load(path).model.img_size == 24
    assert config.load(path, ["train.lr=0.1"]).model.img_size == 24
    assert config.load(path, ["data.root=/y"]).model.img_size is None
    assert config.load(path, ["data.root=/y", "model.img_size=20"]).model.img_size == 20


def test_time_to_target_is_logged_and_stop_at_target_ends_the_run(store):
    """The first epoch reaching train.target logs time_to_target_s (training seconds up to and
    including it, evaluation excluded) and epochs_to_target; stop_at_target ends the run there,
    FINISHED."""
    quick = ["data.dataset=digits", "model.name=accel_cnn_s", "model.img_size=8",
             "train.epochs=8", "train.device=cpu", "train.amp=off", "data.num_workers=0",
             "tracking.system_metrics=false", "train.target={metric: val_accuracy, value: 0.9}"]
    for stop, experiment in (("false", "goes-on"), ("true", "stops")):
        proc = run_in_process("train", *quick, f"train.stop_at_target={stop}",
                              "--tracking-uri", store, "--experiment", experiment)
        assert proc.returncode == 0, proc.stderr[-2000:]
    client = mlflow.MlflowClient(tracking_uri=store)
    curves = {}
    for experiment in ("goes-on", "stops"):
        [run] = runs_in(store, experiment)
        assert run.info.status == "FINISHED"
        curves[experiment] = {key: [m.value for m in sorted(
            client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]
            for key in ("val_accuracy", "epoch_time_s", "time_to_target_s", "epochs_to_target")}
    full = curves["goes-on"]
    first = next(i for i, acc in enumerate(full["val_accuracy"]) if acc >= 0.9) + 1
    assert 1 < first < 8  # the target is reached, and not at once
    assert full["epochs_to_target"] == [first] and len(full["val_accuracy"]) == 8
    assert full["time_to_target_s"] == [pytest.approx(sum(full["epoch_time_s"][:first]))]
    stopped = curves["stops"]
    assert len(stopped["val_accuracy"]) == first and stopped["epochs_to_target"] == [first]
    assert stopped["val_accuracy"] == full["val_accuracy"][:first]  # the same run, cut short


def test_bad_targets_are_refused():
    for overrides, words in (
        (["train.stop_at_target=true"], "needs train.target"),
        (["train.target={metric: val_acc, value: 0.9}"], "train.target.metric='val_acc'"),
        (["train.target={metric: val_accuracy, value: high}"], "train.target.value='high'"),
        (["train.target={metric: val_accuracy}"], "expected {metric: val_accuracy, value: 0.9}"),
    ):
        with pytest.raises(config.ConfigError) as e:
            config.load(None, overrides)
        assert words in str(e.value)


def test_a_dataset_another_process_inserted_first_is_logged_on_the_second_try():
    """Two workers logging the same new dataset at once: the slower insert hits the unique
    constraint; the input is logged again, and any other error still surfaces."""
    from accel.tracking.lineage import log_splits

    record = {"name": "digits-train", "digest": "d", "source": "s", "profile": {},
              "context": "training"}

    class Client:
        def __init__(self, error):
            self.calls, self.error = 0, error

        def log_inputs(self, run_id, datasets):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError(self.error)

    race = Client("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id")
    log_splits(race, "run", [record])
    assert race.calls == 2
    other = Client("disk I/O error")
    with pytest.raises(RuntimeError, match="disk I/O"):
        log_splits(other, "run", [record])
    assert other.calls == 1


@pytest.mark.parametrize("name", ["accel_cnn_s", "test_resnet"])
def test_dirac_init_makes_each_convolution_pass_its_first_channels_through(name):
    """model.dirac_init: every ungrouped odd-kernel convolution maps its first min(in, out)
    input channels to the same output channels unchanged; the other outputs keep the model's
    own init. Without it, no convolution does."""
    from accel.models import build_model

    def convs(dirac: bool) -> list[torch.nn.Conv2d]:
        cfg = config.load(None, [f"model.name={name}", f"model.dirac_init={dirac}"])
        torch.manual_seed(0)
        model = build_model(cfg, num_classes=10, in_chans=3, img_size=16)
        return [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)
                and m.groups == 1 and m.kernel_size[0] % 2 == 1]

    with torch.no_grad():
        for dirac, want in ((True, True), (False, False)):
            found = convs(dirac)
            assert found
            for conv in found:
                x = torch.randn(2, conv.in_channels, 9, 9)
                out = conv(x) - (conv.bias.view(1, -1, 1, 1) if conv.bias is not None else 0)
                n = min(conv.in_channels, conv.out_channels)
                s = conv.stride[0]
                same = torch.allclose(out[:, :n], x[:, :n, ::s, ::s], atol=1e-6)
                assert same == want, (conv, dirac)
                if dirac and conv.out_channels > n:  # the rest keep their init
                    assert conv.weight[n:].abs().sum() > 0


def test_frozen_batchnorm_weights_and_their_momentum_are_what_training_sees():
    """train.bn_weight_frozen: no optimizer holds a BatchNorm weight and a training step leaves
    them at 1; model.bn_momentum: every BatchNorm layer's running statistics move by it."""
    from accel.train.parts import build

    cfg = config.load(None, ["data.dataset=digits", "model.name=accel_cnn_s",
                             "model.img_size=8", "train.device=cpu", "data.num_workers=0",
                             "train.bn_weight_frozen=true", "model.bn_momentum=0.4",
                             "train.bn_bias_lr_scale=64", "train.amp=off"])
    parts = build(cfg)
    norms = [m for m in parts.bare.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and {m.momentum for m in norms} == {0.4}
    held = {id(p) for g in parts.step.optimizer.param_groups for p in g["params"]}
    assert not held & {id(m.weight) for m in norms}
    assert {id(m.bias) for m in norms} <= held
    x, y = next(iter(parts.data.train))
    mean = norms[0].running_mean.clone()
    with torch.no_grad():  # what the stem's first BatchNorm sees of this batch
        batch = parts.bare.stem[0](x.float()).mean(dim=(0, 2, 3))
    parts.trainer.run([(x, y)], max_epochs=1, epoch_length=1)
    assert all(torch.equal(m.weight, torch.ones_like(m.weight)) for m in norms)
    assert not torch.equal(norms[0].running_mean, mean)
    # its running mean moved by 0.4 of the batch mean
    assert torch.allclose(norms[0].running_mean, 0.6 * mean + 0.4 * batch, atol=1e-5)
    assert any(not torch.equal(m.bias, torch.zeros_like(m.bias)) for m in norms)
    parts.data.close()


def test_the_moving_average_is_what_is_evaluated_kept_and_logged(tmp_path, monkeypatch):
    """train.ema_decay: the validation metrics are the averaged weights' (not the trained
    ones'), and the best epoch's weights are the average (best.pt, from which the logged model
    is made)."""
    import accel.train as training
    from accel import engine
    from tests.conftest import TINY_OVERRIDES, new_store

    kept, build = [], training.build
    monkeypatch.setattr(training, "build",
                        lambda cfg, *args: kept.append(build(cfg, *args)) or kept[-1])
    store = new_store(tmp_path)
    cfg = config.load(None, [*TINY_OVERRIDES, "train.epochs=1", "train.ema_decay=0.8",
                             "train.lr=0.01", f"tracking.uri={store}"])
    result = train(cfg)
    [parts] = kept
    averaged, trained = parts.averaged.module, parts.bare
    assert int(parts.averaged.n_averaged) == 6  # one per update: 6 micro-batches, no GA

    def val_loss(model) -> float:
        evaluator = engine.create_evaluator(model, 10, torch.device("cpu"))
        return evaluator.run(parts.data.val).metrics["loss"]

    assert result.history[-1]["val_loss"] == pytest.approx(val_loss(averaged), rel=1e-6)
    assert val_loss(trained) != pytest.approx(val_loss(averaged), rel=1e-3)
    client = mlflow.MlflowClient(store)
    best = torch.load(client.download_artifacts(result.run_id, "checkpoint/best.pt",
                                                str(tmp_path)), weights_only=True)
    for name, value in averaged.state_dict().items():
        assert torch.equal(best[name], value), name
    assert any(not torch.equal(best[k], v) for k, v in trained.state_dict().items())


def test_head_scale_multiplies_the_logits_and_nothing_else():
    """model.head_scale=0.125: the same initial weights (one seed), logits 1/8 of the plain
    model's; the parameters and their names are the network's own under `net.`."""
    from accel.models import build_model

    base = ["data.dataset=digits", "model.name=accel_cnn_s", "model.img_size=8"]
    torch.manual_seed(0)
    plain = build_model(config.load(None, base), 10, 1, 8)
    torch.manual_seed(0)
    scaled = build_model(config.load(None, [*base, "model.head_scale=0.125"]), 10, 1, 8)
    assert [f"net.{k}" for k in plain.state_dict()] == list(scaled.state_dict())
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():  # training mode: BatchNorm on the batch's statistics, logits of order 1
        logits, base_logits = scaled(x), plain(x)
    assert base_logits.abs().mean() > 0.1
    assert torch.allclose(logits, 0.125 * base_logits, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name, side, sides", [("accel_cnn_m", 31, [15, 7, 3]),
                                               ("accel_cnn_s", 7, [4, 2, 1])])
def test_accel_nets_pool_a_whitened_image_down_to_their_last_group(name, side, sides):
    """Behind a 2x2 whitening layer the side is odd: accel_cnn_m rounds down as airbench94 does
    (31 -> 15 -> 7 -> 3), accel_cnn_s rounds up, so a 7 px digit keeps a pixel to its end."""
    import timm

    from accel import nets

    nets.register()
    net = timm.create_model(name, num_classes=10, in_chans=24, whitened=True)
    seen = []
    for pool in (m for m in net.modules() if isinstance(m, torch.nn.MaxPool2d)):
        pool.register_forward_hook(lambda mod, i, out: seen.append(out.shape[-1]))
    assert net(torch.randn(2, 24, side, side)).shape == (2, 10)
    assert seen == sides


WHITENED = ["data.dataset=digits", "model.name=accel_cnn_s", "model.img_size=8",
            "train.device=cpu", "data.num_workers=0", "model.whiten=2",
            "model.whiten_images=300", "train.batch_size=32", "train.epoch_length=4"]


def test_the_whitening_layer_whitens_the_training_patches():
    """model.whiten=2: on the images it was fitted to, the first half of the layer's outputs
    (bias aside) has the covariance diag(l / (l + eps)) over the patches' eigenvalues l: the
    identity where they dwarf eps, nothing across directions; the second half is its negative.
    The weight is fixed (no optimizer holds it); the bias trains at the BatchNorm biases' rate."""
    from accel.resident import first_images
    from accel.train.parts import build

    parts = build(config.load(None, [*WHITENED, "train.bn_bias_lr_scale=64"]))
    layer = parts.bare.whiten
    assert (layer.in_channels, layer.out_channels, layer.kernel_size) == (1, 8, (2, 2))
    sample = first_images(parts.data.train.dataset, 300)
    assert sample.shape == (300, 1, 8, 8)
    with torch.no_grad():
        out = torch.nn.functional.conv2d(sample, layer.weight).double()  # no bias
    first = out[:, :4].permute(0, 2, 3, 1).reshape(-1, 4)
    covariance = first.T @ first / len(first)
    patches = sample.double().unfold(2, 2, 1).unfold(3, 2, 1).reshape(-1, 4)
    eigenvalues = torch.linalg.eigvalsh(patches.T @ patches / len(patches)).flip(0)
    expected = torch.diag(eigenvalues / (eigenvalues + 5e-4))
    assert torch.allclose(covariance, expected, atol=2e-3), (covariance, expected)
    assert (torch.diagonal(covariance)[:3] > 0.99).all()  # the main directions: unit variance
    assert torch.equal(out[:, 4:], -out[:, :4])
    groups = parts.step.optimizer.param_groups
    assert not any(p is layer.weight for g in groups for p in g["params"])
    [scaled] = [g for g in groups if any(p is layer.bias for p in g["params"])]
    assert scaled["lr"] == pytest.approx(64 * parts.cfg.train.lr)
    parts.data.close()


def test_the_whitening_bias_trains_its_epochs_then_stays():
    """train.whiten_bias_epochs=1: the bias moves in epoch 1 and not after, while the rest of
    the network keeps training."""
    from ignite.engine import Events

    from accel.train.parts import build

    parts = build(config.load(None, [*WHITENED, "train.whiten_bias_epochs=1",
                                     "train.optimizer=nesterov", "train.lr=0.05"]))
    bias, head = parts.bare.whiten.bias, parts.bare.net.head.weight
    seen = [(bias.detach().clone(), head.detach().clone())]
    parts.trainer.add_event_handler(
        Events.EPOCH_COMPLETED, lambda _: seen.append((bias.detach().clone(),
                                                       head.detach().clone())))
    # what the backward pass is asked for: the layer's output needs a gradient only while the
    # bias trains (after, one process spares the first convolution its input gradient)
    asked = set()

    def ask(module, _x, out) -> None:  # training's forward passes, not the evaluation's
        if module.training:
            asked.add((parts.trainer.state.epoch, out.requires_grad))

    parts.bare.whiten.register_forward_hook(ask)
    parts.attach()  # the run's handlers: the bias is held from epoch 2's start
    parts.trainer.run(parts.batches, max_epochs=3, epoch_length=4)
    (b0, h0), (b1, h1), (b2, h2), (b3, h3) = seen
    assert not torch.equal(b0, b1) and torch.equal(b1, b2) and torch.equal(b2, b3)
    assert not torch.equal(h1, h2) and not torch.equal(h2, h3)
    assert asked == {(1, True), (2, False), (3, False)}
    assert bias.grad is None
    parts.data.close()


FAULTS_OF_A_SECOND_TENSOR = """
import resource, sys
import torch
from accel.train.memory import keep_freed_memory
applied = keep_freed_memory(True)
if sys.argv[1] != "keep":
    applied = keep_freed_memory(False)  # back to glibc's limits
torch.ones(128 * 2**20, dtype=torch.uint8)  # 128 MiB, freed at once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB, every page written
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt")
# make test-all only: it measures the allocator's settings (page faults), not training
@pytest.mark.slow
def test_kept_freed_memory_is_reused_without_page_faults():
    """train.keep_freed_memory: a tensor as large as a batch's activations, allocated after a
    larger one was freed, reuses the pages that one faulted in; with glibc's defaults it faults
    in each of its 16,384 pages afresh (what a CPU step did for every activation)."""
    faults = {}
    for mode in ("keep", "hand back"):
        out = subprocess.run([sys.executable, "-c", FAULTS_OF_A_SECOND_TENSOR, mode],
                             capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
        assert out[0] == "True", out
        faults[mode] = int(out[1])
    assert faults["keep"] < 1000 and faults["hand back"] >= 16_384, faults


def test_deterministic_accel_cnn_reproduces_bitwise_on_cpu(tiny_overrides):
    """train.deterministic=true with accel's own net (its global max pool has a deterministic
    backward, so the setting is usable on CUDA too): two runs give the same history, bit for
    bit, and cuBLAS's fixed workspace is asked for from the config's load on."""
    import os

    overrides = [*tiny_overrides, "model.name=accel_cnn_s", "model.img_size=8",
                 "train.deterministic=true"]
    first = train(config.load(None, overrides), track=False).history
    second = train(config.load(None, overrides), track=False).history
    times = ("epoch_time_s", "train_throughput", "peak_memory_mb")
    strip = [{k: v for k, v in row.items() if k not in times} for row in (*first, *second)]
    assert strip[:2] == strip[2:] and len(first) == 2
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_tta_for_the_final_scores_only_leaves_each_epoch_as_scored_without_it(gray_imagefolder):
    """eval.tta_every_epoch=false: every epoch's validation is the one without TTA, and the
    final scores (test_*) are the ones with eval.tta. TTA changes no update, so the three runs
    train the same weights; one epoch, so the best epoch is the last in each."""
    base = ["data.dataset=imagefolder", f"data.root={gray_imagefolder}", "model.name=test_resnet",
            "model.img_size=16", "train.epochs=1", "train.epoch_length=2", "train.batch_size=8",
            "train.device=cpu", "train.amp=off", "data.num_workers=0"]

    def run(*overrides):
        result = train(config.load(None, [*base, *overrides]), track=False)
        epoch = [{k: v for k, v in row.items() if k not in TIMINGS} for row in result.history]
        return epoch, {k: v for k, v in result.metrics.items() if k.startswith("test_")}

    plain_epochs, plain_test = run("eval.tta=none")
    every_epochs, every_test = run("eval.tta=multicrop")
    last_epochs, last_test = run("eval.tta=multicrop", "eval.tta_every_epoch=false")
    assert every_epochs != plain_epochs and every_test != plain_test  # TTA scores differently
    assert last_epochs == plain_epochs
    assert last_test == every_test and set(last_test) == {"test_loss", "test_accuracy",
                                                          "test_f1"}
