"""From the best trial to a model people use: `accel best --register` logs and registers the
winner, `accel evaluate` loads it through MLflow and evaluates it (a fresh process without accel
loads it in tests/test_serving.py); bad model URIs, names and data fail in one line."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import yaml

from accel.errors import ConfigError
from tests.conftest import run_in_process
from tests.test_resume import interrupt


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A two-trial digits study, its best trial registered as digits@champion. The learning
    rate warms up over the three epochs to a value that spoils the model: every trial's best
    epoch is the second, so best.pt and the last epoch's weights differ."""
    tmp = tmp_path_factory.mktemp("registry")
    exp = tmp / "s.yaml"
    exp.write_text(yaml.safe_dump({
        "data": {"dataset": "digits", "num_workers": 0},
        "model": {"name": "test_resnet", "img_size": 16},
        "train": {"epochs": 3, "epoch_length": 10, "batch_size": 16, "device": "cpu",
                  "amp": "off", "optimizer": "adamw", "scheduler": "constant",
                  "warmup_epochs": 3},
        "search": {"pruner": "none", "space": {
            "train.lr": {"type": "float", "low": 2.5e-2, "high": 3.0e-2}}},
    }))
    store = f"sqlite:///{tmp / 'mlruns' / 'mlflow.db'}"
    where = ["--storage", str(tmp / "optuna.journal"), "--tracking-uri", store]
    tune = run_in_process("tune", str(exp), "--study", "s", "--n-trials", "2", *where)
    assert tune.returncode == 0, tune.stderr[-2000:]
    best = run_in_process("best", "--study", "s", "--register", "digits", *where)
    assert best.returncode == 0, best.stderr[-2000:]
    return store, where, best.stdout


def client(store: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(store)


def test_best_registers_the_winner_with_its_lineage(study):
    store, _, out = study
    assert "registered: models:/digits@champion (version 1, pt2)" in out
    version = client(store).get_model_version_by_alias("digits", "champion")
    assert str(version.version) == "1"
    run_id = next(line.split()[2] for line in out.splitlines() if line.startswith("mlflow run:"))
    trial = client(store).get_run(run_id)
    assert version.run_id == run_id
    assert version.tags["accel.study"] == "s"
    assert version.tags["optuna.trial_number"] == trial.data.tags["optuna.trial_number"]
    assert version.tags["accel.metric"] == "val_accuracy"
    assert float(version.tags["accel.value"]) == pytest.approx(
        trial.data.metrics["best_val_accuracy"], abs=5e-7)
    assert version.tags["accel.serialization"] == "pt2"


def test_the_registered_champion_evaluates_as_its_trial_did(study):
    """Loaded through MLflow from the store: its accuracy on the trial's own validation split
    (digits has no test split) is the trial's best epoch's, exactly."""
    store, where, out = study
    proc = run_in_process("evaluate", "models:/digits@champion", "--tracking-uri", store)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("models:/digits@champion on digits (val split, ")
    c = client(store)
    trial = c.get_run(c.get_model_version_by_alias("digits", "champion").run_id)
    [run] = c.search_runs([trial.info.experiment_id], "tags.`accel.role` = 'evaluate'")
    assert run.data.tags["accel.evaluates"] == "models:/digits@champion"
    curve = [m.value for m in sorted(c.get_metric_history(trial.info.run_id, "val_accuracy"),
                                     key=lambda m: m.step)]
    assert len(curve) == 3 and max(curve) > curve[-1], f"the last epoch is the best: {curve}"
    assert run.data.metrics["val_accuracy"] == trial.data.metrics["best_val_accuracy"]
    assert {f"val_class_accuracy.{i}" for i in range(10)} <= set(run.data.metrics)
    assert "confusion_matrix.png" in [f.path for f in c.list_artifacts(run.info.run_id)]
    # It says which data it evaluated on: the very split the trial validated on.
    [seen] = run.inputs.dataset_inputs
    [same] = [i for i in trial.inputs.dataset_inputs if i.dataset.name == "digits-val"]
    assert (seen.dataset.name, seen.dataset.digest) == ("digits-val", same.dataset.digest)


def test_experiments_open_on_the_runs_table_and_studies_name_their_metric(study):
    import optuna

    from accel.tune import open_storage

    store, where, _ = study
    experiment = client(store).get_experiment_by_name("s")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    s = optuna.load_study(study_name="s", storage=open_storage(where[1]))
    assert s.metric_names == ["val_accuracy"]
    # `accel best` says where to look: the study's runs table, not the GenAI overview.
    assert (f"accel ui --tracking-uri {store}, then open http://127.0.0.1:5000/#/"
            f"experiments/{experiment.experiment_id}/runs?workflowType=machine_learning"
            in study[2])


def test_a_tracking_servers_page_is_linked_without_its_password():
    from accel.tracking.store import browse_hint

    assert browse_hint("https://alice:s3cret@mlflow.example.org:5000", "7") == (
        "https://mlflow.example.org:5000/#/experiments/7/runs?workflowType=machine_learning")


@pytest.mark.parametrize("uri,says", [
    ("models:/nope@champion", "model models:/nope@champion: "),
    ("models:/digits@missing", "model models:/digits@missing: "),
    ("digits", "model URI 'digits': use models:/NAME@ALIAS, models:/NAME/VERSION or runs:/"),
])
def test_a_bad_model_uri_is_one_line(study, uri, says):
    store, _, _ = study
    proc = run_in_process("evaluate", uri, "--tracking-uri", store)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if "mlflow.store.db" not in line]
    assert len(lines) == 1 and lines[0].startswith(f"accel: error: {says}"), proc.stderr


def test_data_the_model_cannot_take_is_one_line(study, tiny_imagefolder):
    store, _, _ = study
    proc = run_in_process("evaluate", "models:/digits@champion", "data.dataset=imagefolder",
                   f"data.root={tiny_imagefolder}", "--tracking-uri", store)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "accel: error: the model takes images of 1 channel of "), proc.stderr


def test_a_model_with_another_class_count_is_refused():
    from accel import config
    from accel.evaluate import evaluate

    cfg = config.load(None, ["data.dataset=digits", "model.img_size=8"])
    three = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    with pytest.raises(ConfigError, match="the model predicts 3 classes, digits .* has 10"):
        evaluate(three, cfg)


@pytest.mark.parametrize("name,alias", [
    ("a/b", "champion"), ("team:digits", "champion"), ("..", "champion"), ("digits@x", "champion"),
    ("digits", "v2"), ("digits", "Latest"), ("digits", "best model"), ("digits", "a" * 256),
])
def test_bad_registered_names_are_refused_before_anything_is_logged(study, name, alias):
    """MLflow's own rules (names without '/' or ':', aliases of letters, digits, '_' and '-',
    'latest' and v<N> reserved), checked before a model is logged: one line, exit 2."""
    import mlflow

    store, where, _ = study
    mlflow.set_tracking_uri(store)
    before = len(mlflow.search_logged_models(output_format="list"))
    registered = len(client(store).search_registered_models())
    bad = f"--register {name!r}" if name != "digits" else f"--alias {alias!r}"
    proc = run_in_process("best", "--study", "s", "--register", name, "--alias", alias, *where)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = [x for x in proc.stderr.splitlines() if "mlflow.store.db" not in x]
    assert line.startswith(f"accel: error: {bad}"), proc.stderr
    assert len(mlflow.search_logged_models(output_format="list")) == before
    assert len(client(store).search_registered_models()) == registered


def test_accel_ui_lists_each_experiments_runs_page(study, monkeypatch, capsys):
    from accel import foreground
    from accel.cli import main

    store = study[0]
    started = []
    monkeypatch.setattr(foreground, "run_group", lambda cmd, env: started.append(cmd) or 0)
    assert main(["ui", "--tracking-uri", store, "--port", "5123"]) == 0
    experiment = client(store).get_experiment_by_name("s")
    assert (f"  s: http://127.0.0.1:5123/#/experiments/{experiment.experiment_id}/runs"
            "?workflowType=machine_learning") in capsys.readouterr().err.splitlines()
    [command] = started
    assert command[command.index("--host") + 1] == "127.0.0.1"


def test_a_single_run_logs_its_model_when_asked(tmp_path, tiny_overrides):
    """`tracking.log_model=true`: the best epoch's weights as an MLflow model in the run (no
    registry), loadable through MLflow and equal to checkpoint/best.pt."""
    import mlflow

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_in_process("train", *tiny_overrides, "tracking.log_model=true",
                          "--tracking-uri", store, "--experiment", "one")
    assert proc.returncode == 0, proc.stderr[-2000:]
    c = client(store)
    [run] = c.search_runs([c.get_experiment_by_name("one").experiment_id])
    mlflow.set_tracking_uri(store)
    [model] = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id],
                                          output_format="list")
    assert model.source_run_id == run.info.run_id
    assert c.search_registered_models() == []
    best = torch.load(c.download_artifacts(run.info.run_id, "checkpoint/best.pt", str(tmp_path)),
                      weights_only=True)
    loaded = mlflow.pytorch.load_model(f"runs:/{run.info.run_id}/model", map_location="cpu")
    x = torch.rand(2, 1, 16, 16)  # images as users have them: [0, 1]
    from accel import config, models
    from accel.data import normalisation

    cfg = config.load(None, tiny_overrides)
    reference = models.build_model(cfg, 10, 1, 16)
    reference.load_state_dict(best)
    mean, std = normalisation("digits", 1)
    with torch.no_grad():  # the logged model normalises inside, as the registered one does
        assert torch.allclose(loaded(x), reference.eval()((x - mean[0]) / std[0]), atol=1e-5)
    metadata = mlflow.models.get_model_info(f"runs:/{run.info.run_id}/model").metadata
    assert metadata["classes"] == [str(i) for i in range(10)]
    assert metadata["input"] == "float32 NCHW [0, 1]"


def logged_models(store: str) -> list:
    import mlflow

    mlflow.set_tracking_uri(store)
    ids = [e.experiment_id for e in client(store).search_experiments()]
    return mlflow.search_logged_models(experiment_ids=ids, output_format="list")


def poll(condition, what: str, timeout_s: float = 240):
    """condition()'s first true answer, polled; a slow, loaded machine gets time."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if answer := condition():
            return answer
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# make test covers it: the trial's run left FINISHED by a stop while registering: [2] (SIGINT)
@pytest.mark.parametrize("sig", [signal.SIGINT,
                                 pytest.param(signal.SIGKILL, marks=pytest.mark.slow)])
def test_stopping_a_registration_leaves_the_trials_run_finished(study, sig):
    """Ctrl-C (or SIGKILL) while `accel best --register` logs the model: the winning trial's
    run is never reopened, so it stays FINISHED."""
    store, where, out = study
    run_id = next(line.split()[2] for line in out.splitlines() if line.startswith("mlflow run:"))
    before = len(logged_models(store))
    _, code, err = interrupt(["best", "--study", "s", "--register", "stopped", *where],
                             lambda: poll(lambda: len(logged_models(store)) > before,
                                          "the model to be logged"), sig)
    assert code == (130 if sig == signal.SIGINT else -signal.SIGKILL), err
    assert client(store).get_run(run_id).info.status == "FINISHED"
    if sig == signal.SIGINT:  # the last line says what the stop left, and no run KILLED
        last = err.strip().splitlines()[-1]
        done = ("stopped@champion is version "
                f"{client(store).get_model_version_by_alias('stopped', 'champion').version}, "
                f"the model of run {run_id}: the registration was complete"
                if "registration was complete" in last else None)
        assert last in (
            f"accel: stopped by Ctrl-C; the model being logged into run {run_id} was marked "
            "FAILED (the run stays as it was): run the same command again",
            f"accel: stopped by Ctrl-C; the model of run {run_id} was logged but not "
            "registered as stopped@champion (the run stays as it was): run the same command "
            "again",
            # the stop came after the registration, before the command's last lines
            f"accel: stopped by Ctrl-C; {done}"), err[-2000:]


def digits_pngs(root, classes=None) -> int:
    """The trial's validation images (digits, 8x8, seed 0) as gray PNGs root/<class>/<i>.png:
    images as users have them. Returns how many."""
    import numpy as np
    from PIL import Image

    from accel.data import load_digits_arrays, split_indices

    images, labels = load_digits_arrays()
    _, val = split_indices(len(labels), 0.1, 0)
    written = 0
    for i in val:
        if classes is None or str(labels[i]) in classes:
            folder = root / str(labels[i])
            folder.mkdir(parents=True, exist_ok=True)
            pixels = np.round(images[i] * 255 / 16).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(folder / f"{i}.png")
            written += 1
    return written


def evaluated(store: str, root, *more: str, split: str = "test") -> dict[str, float]:
    """`accel evaluate` of the champion on an image folder: the evaluation run's metrics."""
    proc = run_in_process("evaluate", "models:/digits@champion", "data.dataset=imagefolder",
                   f"data.root={root}", "tracking.experiment=scans", *more,
                   "--tracking-uri", store)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"models:/digits@champion on imagefolder ({split} split, ")
    run_id = proc.stdout.split("mlflow run: ")[1].split()[0]
    return client(store).get_run(run_id).data.metrics


def test_a_folder_of_test_images_only_or_of_class_folders_is_evaluated(study, tmp_path):
    """No train/ folder is needed: root/test/<class>/*, or root/<class>/* itself; a folder with
    some of the classes is scored against the model's own class indices."""
    store = study[0]
    n = digits_pngs(tmp_path / "only" / "test")
    digits_pngs(tmp_path / "flat")
    some = digits_pngs(tmp_path / "some" / "test", classes=("3", "7"))
    only, flat = evaluated(store, tmp_path / "only"), evaluated(store, tmp_path / "flat")
    assert only["images"] == flat["images"] == n == 180
    assert only["test_accuracy"] == flat["test_accuracy"]
    c = client(store)
    trial = c.get_run(c.get_model_version_by_alias("digits", "champion").run_id)
    # The same images, saved as 8-bit PNGs and resized from the files: nearly the trial's.
    assert abs(only["test_accuracy"] - trial.data.metrics["best_val_accuracy"]) <= 0.03
    part = evaluated(store, tmp_path / "some")
    assert part["images"] == some
    assert {k for k in part if k.startswith("test_class_accuracy.")} == {
        "test_class_accuracy.3", "test_class_accuracy.7"}
    for c in ("3", "7"):
        assert part[f"test_class_accuracy.{c}"] == only[f"test_class_accuracy.{c}"]


def test_every_image_given_is_evaluated_unless_split_says_otherwise(study, tmp_path):
    """A tree of train/ only (new scans, say) is evaluated whole, not a validation cut of it; a
    full tree gives test/ unless --split picks another; a split it lacks is one line, exit 2."""
    store = study[0]
    n = digits_pngs(tmp_path / "scans" / "train")
    whole = evaluated(store, tmp_path / "scans", split="train")
    assert whole["images"] == n == 180 and "train_accuracy" in whole
    full = tmp_path / "full"
    digits_pngs(full / "train")
    digits_pngs(full / "test")
    some = digits_pngs(full / "val", classes=("3", "7"))
    assert evaluated(store, full)["images"] == n
    assert evaluated(store, full, "--split", "val", split="val")["images"] == some
    assert evaluated(store, full, "--split", "train", split="train")["images"] == n
    bad = run_in_process("evaluate", "models:/digits@champion", "data.dataset=imagefolder",
                         f"data.root={tmp_path / 'scans'}", "--split", "val",
                         "--tracking-uri", store)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"accel: error: --split val: data.root='{tmp_path / 'scans'}' has no val/ folder "
        "(it has train/)"], bad.stderr


def test_sigterm_while_evaluating_ends_the_evaluation_run_killed(study, tmp_path):
    """The evaluation runs inside its MLflow run; SIGTERM there ends it KILLED, exit 143."""
    store = study[0]
    digits_pngs(tmp_path / "scans" / "test")
    # Read last, never written: the evaluation waits on it until the stop arrives.
    os.mkfifo(tmp_path / "scans" / "test" / "9" / "zz.png")
    c = client(store)
    running = ("tags.`accel.role` = 'evaluate' and attributes.status = 'RUNNING'")

    def evaluating():
        ids = [e.experiment_id for e in c.search_experiments()]
        return [r.info.run_id for r in c.search_runs(ids, running)]

    [run_id], code, err = interrupt(
        ["evaluate", "models:/digits@champion", "data.dataset=imagefolder",
         f"data.root={tmp_path / 'scans'}", "tracking.experiment=scans", "--tracking-uri", store],
        lambda: poll(evaluating, "the evaluation run"), signal.SIGTERM)
    assert code == 143, err
    assert c.get_run(run_id).info.status == "KILLED"


def test_a_chance_level_study_is_said_and_not_registered_without_force(tmp_path):
    """Every trial at a learning rate that learns nothing (digits: 10 classes): `accel tune`'s
    last line and `accel best` say the best value is within noise of chance; `--register`
    refuses with one line (exit 2) and registers nothing, unless `--force`."""
    from tests.conftest import TINY_OVERRIDES

    exp = tmp_path / "flat.yaml"
    exp.write_text(yaml.safe_dump({"search": {"pruner": "none", "space": {
        "train.lr": {"type": "float", "low": 1.0e-9, "high": 2.0e-9}}}}))
    store = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    where = ["--storage", str(tmp_path / "optuna.journal"), "--tracking-uri", store]
    tiny = [*TINY_OVERRIDES, "tracking.system_metrics=false"]
    tune = run_in_process("tune", str(exp), *tiny, "--study", "flat", "--n-trials", "2", *where)
    assert tune.returncode == 0, tune.stderr[-2000:]
    said = "is within noise of chance for 10 classes"
    assert said in tune.stderr.strip().splitlines()[-1], tune.stderr[-1000:]
    best = run_in_process("best", "--study", "flat", *where)
    assert best.returncode == 0 and said in best.stderr, best.stderr[-1000:]
    refused = run_in_process("best", "--study", "flat", "--register", "flat", *where)
    assert refused.returncode == 2, refused.stderr[-1000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("accel: error: study flat: not registering trial ") and "--force" in last
    assert client(store).search_registered_models() == []
    forced = run_in_process("best", "--study", "flat", "--register", "flat", "--force", *where)
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert "registered: models:/flat@champion" in forced.stdout


def test_chance_level_rests_on_the_validation_size():
    from accel.tune.chance import chance_level

    assert chance_level("val_accuracy", 0.14, 10, 360)  # 0.1 + 3 x 0.0158
    assert chance_level("val_accuracy", 0.16, 10, 360) is None
    assert chance_level("val_accuracy", 0.16, 10, 100)  # fewer images: wider noise
    assert chance_level("val_loss", 2.3, 10, 360) is None  # not an accuracy
    assert chance_level("val_f1", 0.05, None, 360) is None  # classes unknown
