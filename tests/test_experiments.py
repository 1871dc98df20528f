"""Every experiment file loads and trains one short epoch, with a tiny model of its family."""

from __future__ import annotations

from pathlib import Path

import pytest

from accel import config
from accel.train import train
from tests.conftest import ROOT

EXPERIMENTS = sorted((ROOT / "experiments").rglob("*.yaml"))
TINY_MODELS = {"vit": "test_vit", "deit": "test_vit", "efficientnet": "test_efficientnet"}


def tiny_model(name: str) -> str:
    return next((tiny for family, tiny in TINY_MODELS.items() if family in name), "test_resnet")


def test_experiments_exist():
    assert ROOT / "experiments" / "quickstart.yaml" in EXPERIMENTS


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_experiment_runs_one_short_epoch(path: Path, tiny_imagefolder: Path):
    text = path.read_text()
    assert text.startswith("#"), "the header says how to run it and what it gives"
    cfg = config.load(path)
    overrides = [
        f"model.name={tiny_model(cfg.model.name)}",
        "train.epochs=1",
        "train.epoch_length=2",
        "train.batch_size=8",
        "train.device=cpu",
        "train.compile=false",
        "data.num_workers=0",
        "data.train_limit=null",
    ]
    if cfg.data.dataset != "digits":  # the real data sets are not in the repo
        overrides += ["data.dataset=imagefolder", f"data.root={tiny_imagefolder}"]
    cfg = config.load(path, overrides)
    result = train(cfg, track=False)
    assert result.epochs == 1
    assert 0.0 <= result.metrics["val_accuracy"] <= 1.0
