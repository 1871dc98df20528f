"""From the best trial to a model people use: `accel best --register` logs and registers the
winner, `accel evaluate` loads it through MLflow in a fresh process and evaluates it; bad model
URIs, names and data fail in one line."""

from __future__ import annotations

import pytest
import torch
import yaml

from accel.errors import ConfigError
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A two-trial digits study, its best trial registered as digits@champion."""
    tmp = tmp_path_factory.mktemp("registry")
    exp = tmp / "s.yaml"
    exp.write_text(yaml.safe_dump({
        "data": {"dataset": "digits", "num_workers": 0},
        "model": {"name": "test_resnet", "img_size": 16},
        "train": {"epochs": 2, "epoch_length": 10, "batch_size": 16, "device": "cpu",
                  "amp": "off"},
        "search": {"pruner": "none", "space": {
            "train.lr": {"type": "float", "low": 1.0e-3, "high": 3.0e-3}}},
    }))
    store = f"sqlite:///{tmp / 'mlruns' / 'mlflow.db'}"
    where = ["--storage", str(tmp / "optuna.journal"), "--tracking-uri", store]
    tune = run_cli("tune", str(exp), "--study", "s", "--n-trials", "2", *where)
    assert tune.returncode == 0, tune.stderr[-2000:]
    best = run_cli("best", "--study", "s", "--register", "digits", *where)
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
    """Loaded through MLflow in a fresh process: its accuracy on the trial's own validation
    split (digits has no test split) is the trial's best epoch's, exactly."""
    store, where, out = study
    proc = run_cli("evaluate", "models:/digits@champion", "--tracking-uri", store)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("models:/digits@champion on digits (val split, ")
    c = client(store)
    [run] = c.search_runs([e.experiment_id for e in c.search_experiments()],
                          "tags.`accel.role` = 'evaluate'")
    assert run.data.tags["accel.evaluates"] == "models:/digits@champion"
    trial = c.get_run(c.get_model_version_by_alias("digits", "champion").run_id)
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
    assert (f"browse: accel ui --tracking-uri {store}, then open http://127.0.0.1:5000/#/"
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
    proc = run_cli("evaluate", uri, "--tracking-uri", store)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if "mlflow.store.db" not in line]
    assert len(lines) == 1 and lines[0].startswith(f"accel: error: {says}"), proc.stderr


def test_data_the_model_cannot_take_is_one_line(study, tiny_imagefolder):
    store, _, _ = study
    proc = run_cli("evaluate", "models:/digits@champion", "data.dataset=imagefolder",
                   f"data.root={tiny_imagefolder}", "--tracking-uri", store)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "accel: error: the model cannot take imagefolder images of shape (3, "), proc.stderr


def test_a_model_with_another_class_count_is_refused():
    from accel import config
    from accel.evaluate import evaluate

    cfg = config.load(None, ["data.dataset=digits", "model.img_size=8"])
    three = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    with pytest.raises(ConfigError, match="the model predicts 3 classes, digits .* has 10"):
        evaluate(three, cfg)


@pytest.mark.parametrize("name,alias", [("a/b", "champion"), ("digits", "v2")])
def test_bad_registered_names_are_refused_before_anything_is_logged(study, name, alias):
    store, where, _ = study
    proc = run_cli("best", "--study", "s", "--register", name, "--alias", alias, *where)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].startswith("accel: error: --")


def test_accel_ui_lists_each_experiments_runs_page(study, monkeypatch, capsys):
    import subprocess

    from accel.cli import main

    store = study[0]
    started = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, env: started.append(cmd) or 0)
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
    proc = run_cli("train", *tiny_overrides, "tracking.log_model=true", "--tracking-uri", store,
                   "--experiment", "one")
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
    x = torch.randn(2, 1, 16, 16)
    from accel import config, models

    cfg = config.load(None, tiny_overrides)
    reference = models.build_model(cfg, 10, 1, 16)
    reference.load_state_dict(best)
    with torch.no_grad():
        assert torch.allclose(loaded(x), reference.eval()(x), atol=1e-5)
