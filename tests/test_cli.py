"""Bad input through the real CLI: exit 2, one line naming the value and what is allowed."""

from __future__ import annotations

import pytest

from accel import config, config_params
from tests.conftest import ROOT, TINY_OVERRIDES, run_cli, run_in_process

BAD_INPUTS = {
    "unknown key": (["train.lrr=0.1"], ["train.lrr", "train.lr"]),
    "wrong type": (["train.epochs=many"], ["train.epochs", "integer"]),
    "lr <= 0": (["train.lr=0"], ["train.lr", "> 0"]),
    "accumulation < 1": (["train.accumulation_steps=0"], ["train.accumulation_steps", ">= 1"]),
    "batch size < 1": (["train.batch_size=0"], ["train.batch_size", ">= 1"]),
    "unknown optimizer": (["train.optimizer=adagrad"], ["adagrad", "adam, adamw, sgd, nesterov"]),
    "unknown tta": (["eval.tta=crops"], ["eval.tta", "crops", "none, flip"]),
    "unknown scheduler": (["train.scheduler=step"], ["step", "cosine, linear, constant"]),
    "unknown model": (["model.name=resnet5O"], ["resnet5O", "did you mean", "resnet50"]),
    "missing data dir": (
        ["data.dataset=imagefolder", "data.root=/nonexistent/cifar"],
        ["/nonexistent/cifar", "train/"],
    ),
    "missing cifar": (
        ["data.dataset=cifar10", "data.root=/nonexistent/c10"],
        ["/nonexistent/c10", "data.download=true"],
    ),
    "malformed override": (["experiments/quickstart.yaml", "train.lr"], ["train.lr", "KEY=VALUE"]),
    "bare word": (["train.lr"], ["train.lr", "KEY=VALUE"]),
    "unreadable config": (["no/such/experiment.yaml"], ["no/such/experiment.yaml"]),
    "unknown amp": (["train.amp=fp8"], ["fp8", "off, auto, bf16, fp16"]),
    "unknown search metric": (["search.metric=val_acc"], ["search.metric",
                                                          "val_accuracy, val_loss, val_f1"]),
    "unknown direction": (["search.direction=max"], ["search.direction", "maximize, minimize"]),
    "unknown pruner": (["search.pruner=asha"], ["search.pruner", "median, hyperband, none"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(case, tmp_path):
    items, expected = BAD_INPUTS[case]
    proc = run_in_process("train", *items, "--tracking-uri", f"sqlite:///{tmp_path}/m.db")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for text in expected:
        assert text in lines[0]


def test_invalid_yaml_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {lr: [\n")
    proc = run_in_process("train", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"accel: error: config file '{bad}' is not valid YAML line 2"
    ]


def test_unknown_flag_is_one_line():
    proc = run_in_process("train", "--epochs", "3")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_help_answers():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for command in ("train", "tune", "best", "reproduce", "resume", "evaluate", "ablate", "ui"):
        assert command in proc.stdout


def test_overrides_are_typed():
    cfg = config.load(
        None,
        [
            "train.lr=3e-3",
            "train.clip_grad_norm=null",
            "train.compile=true",
            "model.img_size=32",
            "train.warmup_epochs=1",
        ],
    )
    assert cfg.train.lr == 0.003 and cfg.train.clip_grad_norm is None
    assert cfg.train.compile == "default" and cfg.model.img_size == 32
    assert isinstance(cfg.train.warmup_epochs, float)
    assert cfg.flat()["train.lr"] == 0.003


def test_yaml_round_trip(tmp_path):
    cfg = config.load(None, ["train.lr=0.02", "train.clip_grad_norm=2.5", "name=roundtrip"])
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    assert config.load(path) == cfg


def test_options_may_come_before_between_or_after_the_config():
    from accel import cli

    orders = (
        ["tune", "--study", "x", "experiments/quickstart.yaml", "train.epochs=2"],
        ["tune", "experiments/quickstart.yaml", "train.epochs=2", "--study", "x"],
        ["tune", "experiments/quickstart.yaml", "--study", "x", "train.epochs=2"],
    )
    parsed = [vars(cli.parse(argv)) for argv in orders]
    assert parsed[0] == parsed[1] == parsed[2]
    assert parsed[0]["items"] == ["experiments/quickstart.yaml", "train.epochs=2"]
    assert parsed[0]["study"] == "x" and parsed[0]["command"] == "tune"


def test_train_runs_with_options_first(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_in_process("train", "--tracking-uri", store, "--experiment", "first",
                          "experiments/quickstart.yaml", *TINY_OVERRIDES, "train.epochs=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("run ") and "1 epochs" in proc.stdout


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").rglob("*.yaml")),
                         ids=lambda p: p.stem)
def test_config_from_params_inverts_flat(path):
    """Every experiment file survives flat() -> MLflow param text -> from_params()."""
    cfg = config.load(path)
    params = {k: config.param_text(v) for k, v in cfg.flat().items()}
    rebuilt, notes = config_params.from_params(params)
    assert rebuilt == cfg and notes == []


@pytest.mark.parametrize("damage,workers", [("truncated", 0), ("not an image", 0),
                                            ("truncated", 2)])
def test_an_unreadable_image_is_named_in_one_line(tmp_path, damage, workers):
    """Also when a DataLoader worker process reads it: torch re-raises the worker's error with
    the worker's traceback as its message; the user still sees one line naming the file. With
    workers, a real `accel` process: its whole stderr, the workers' included, is that one line;
    without, the command in this process."""
    import numpy as np
    from PIL import Image

    for c in ("a", "b"):
        folder = tmp_path / "data" / "train" / c
        folder.mkdir(parents=True)
        for i in range(6):
            pixels = np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.jpg")
    bad = tmp_path / "data" / "train" / "b" / "3.jpg"
    bad.write_bytes(bad.read_bytes()[:200] if damage == "truncated" else b"not an image")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = run_cli if workers else run_in_process
    proc = run("train", "data.dataset=imagefolder", f"data.root={tmp_path / 'data'}",
               "model.name=test_resnet", "model.img_size=32", "train.epochs=1",
               "train.batch_size=4", f"data.num_workers={workers}", "--tracking-uri", store,
               "--experiment", "bad")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "mlflow.store.db" not in line]
    assert lines == [lines[-1]] and str(bad) in lines[0], proc.stderr  # one line, the file named
    import mlflow

    client = mlflow.MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name("bad").experiment_id])
    assert run.info.status == "FAILED"


def test_yaml_that_would_build_python_objects_is_refused(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo pwned > "
                    f"{tmp_path / 'pwned'}']\n")
    proc = run_in_process("train", str(evil))
    assert proc.returncode == 2 and not (tmp_path / "pwned").exists()
    assert proc.stderr.strip().splitlines() == [
        f"accel: error: config file '{evil}' is not valid YAML line 1"]


def disk_full_at_the_first_checkpoint(monkeypatch) -> None:
    """The artifact store fails with ENOSPC when the run writes its first checkpoint (a fault
    injected into the command, run in this process: the disk of the test machine is not full)."""
    import errno
    import os

    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    real = LocalArtifactRepository.log_artifact

    def log_artifact(self, local_file, artifact_path=None):
        if artifact_path == "checkpoint":
            target = os.path.join(self.artifact_dir, artifact_path, os.path.basename(local_file))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), target)
        return real(self, local_file, artifact_path)

    monkeypatch.setattr(LocalArtifactRepository, "log_artifact", log_artifact)


def _only_run(store: str, experiment: str):
    import mlflow

    client = mlflow.MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


def test_a_full_disk_ends_the_run_failed_naming_the_path(tmp_path, tiny_overrides, monkeypatch):
    store = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    disk_full_at_the_first_checkpoint(monkeypatch)
    proc = run_in_process("train", *tiny_overrides, "--tracking-uri", store,
                          "--experiment", "full")
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("accel: error: [Errno 28] No space left on device: ")
    assert str(tmp_path / "mlruns" / "artifacts" / "full") in last and "checkpoint" in last
    assert "Traceback" not in proc.stderr
    assert _only_run(store, "full").info.status == "FAILED"


def test_an_artifact_folder_that_cannot_be_written_ends_the_run_failed(tmp_path, tiny_overrides):
    """Where the experiment's artifacts go is taken by a file (permissions would not stop the
    root user the tests may run as): the run ends FAILED, the message names the path."""
    store = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    blocked = tmp_path / "mlruns" / "artifacts" / "blocked"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a folder")
    proc = run_in_process("train", *tiny_overrides, "--tracking-uri", store,
                          "--experiment", "blocked")
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("accel: error: ") and str(blocked) in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert _only_run(store, "blocked").info.status == "FAILED"


def test_dashboard_needs_its_extra_and_an_existing_study(tmp_path, monkeypatch, capsys):
    import importlib.util

    from accel.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "optuna_dashboard" else real(name, *a))
    assert main(["dashboard", "--storage", str(tmp_path / "optuna.journal")]) == 2
    assert capsys.readouterr().err.strip() == (
        "accel: error: optuna-dashboard is not installed: pip install -e '.[dashboard]'")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert main(["dashboard", "--storage", str(tmp_path / "optuna.journal")]) == 2
    assert capsys.readouterr().err.strip().startswith(
        f"accel: error: no Optuna storage at {tmp_path / 'optuna.journal'}")


QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")


@pytest.mark.parametrize("command", [["train", QUICKSTART, *TINY_OVERRIDES],
                                     ["tune", QUICKSTART, "--study", "s"], ["ui"],
                                     ["reproduce", "0123abcd"]], ids=lambda c: c[0])
def test_a_file_store_is_refused_in_one_line_naming_the_stores_that_work(tmp_path, command,
                                                                         monkeypatch):
    """MLflow 3 no longer writes to `file:` stores (its "maintenance mode" error)."""
    from tests import conftest

    store = (tmp_path / "mlruns").as_uri()
    monkeypatch.setattr(conftest, "ROOT", tmp_path)  # run_in_process runs here: default storage
    proc = run_in_process(*command, "--tracking-uri", store)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    for text in (store, "sqlite:///", "postgresql://", "http"):
        assert text in lines[0]
    assert not (tmp_path / "mlruns").exists()


def test_help_lists_every_technique_ablate_accepts():
    from accel.ablation.plan import TECHNIQUES
    from accel.cli import build_parser

    _, commands = build_parser()
    [action] = [a for a in commands["ablate"]._actions if "--techniques" in a.option_strings]
    listed = action.help.split("from ", 1)[1].split(" (")[0].split(", ")
    assert listed == list(TECHNIQUES)


def test_the_shared_cifar10_missing_says_which_command_extracts_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    proc = run_in_process("train", "experiments/cifar10_cpu.yaml",
                          f"data.root={tmp_path / 'cache' / 'cifar10-jpeg'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.endswith("has no train/ folder: an imagefolder dataset needs root/train/<class>/"
                         "*.jpg (and optionally root/val, root/test); `python -m "
                         "accel.shared_data` extracts the shared CIFAR-10 there"), line
