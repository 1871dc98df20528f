"""Every experiment file loads and trains one short epoch, with a tiny model of its family."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

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
def test_experiment_runs_one_short_epoch(path: Path, tiny_imagefolder: Path, monkeypatch):
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
        "train.budget_s=null",  # one short epoch, not a budget's worth
        "data.num_workers=0",
        "data.train_limit=null",
    ]
    if cfg.data.dataset != "digits":  # the real data sets are not in the repo
        overrides += ["data.dataset=imagefolder", f"data.root={tiny_imagefolder}"]
    cfg = config.load(path, overrides)
    built = keep_parts(monkeypatch)
    result = train(cfg, track=False)
    parts, before = built["parts"], built["weights"]
    assert result.epochs == 1
    # It trained: 2 micro-batches of 8 images went through the update step, and the weights
    # moved (an optimizer step) and stayed finite.
    row = result.history[0]
    assert row["train_throughput"] * row["epoch_time_s"] == pytest.approx(2 * 8, rel=1e-6)
    after = dict(parts.bare.named_parameters())  # parameters: BatchNorm's buffers move anyway
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values())
    # val_accuracy is the share of every validation image the trained weights get right
    # (the evaluator's last pass may have been the test split: evaluate again).
    matrix = parts.evaluator.run(parts.data.val).metrics["confusion_matrix"]
    assert int(matrix.sum()) == len(parts.data.val.dataset)
    assert result.metrics["val_accuracy"] == pytest.approx(float(matrix.trace() / matrix.sum()))


def keep_parts(monkeypatch) -> dict:
    """What `train` builds, and the weights before the first step."""
    module = importlib.import_module("accel.train")
    real, built = module.build, {}

    def build(cfg, *args):
        parts = built["parts"] = real(cfg, *args)
        built["weights"] = {k: v.detach().clone() for k, v in parts.bare.named_parameters()}
        return parts

    monkeypatch.setattr(module, "build", build)
    return built


def test_the_fast_recipe_bench_says_which_differences_are_beyond_noise():
    """bench/fast_recipe.py's table: each variant's test accuracy against the recipe, paired by
    seed: one always 2 points lower is "lower", one that goes both ways is "no"."""
    from bench.fast_recipe import VARIANTS, table

    assert next(iter(VARIANTS)) == "recipe"
    seen = {"recipe": [(0.80, 60.0), (0.82, 61.0), (0.81, 59.0)],
            "- worse": [(0.78, 60.0), (0.80, 60.0), (0.79, 60.0)],
            "- mixed": [(0.81, 60.0), (0.81, 60.0), (0.82, 60.0)]}
    rows = {line.split(" | ")[0].strip("| "): line for line in table(seen).splitlines()[2:]}
    assert "-0.0200 [-0.0200, -0.0200] | lower" in rows["- worse"]
    assert "| no |" in rows["- mixed"] and "0.8133 (0.8100–0.8200)" in rows["- mixed"]
    assert rows["recipe"].startswith("| recipe | 0.8100 (0.8000–0.8200) |")


def test_every_fast_recipe_variant_is_a_valid_config():
    """Each variant of bench/fast_recipe.py loads over the recipe (a misspelt key or a value the
    config refuses fails here, not an hour into the bench) and changes what it says it does."""
    from accel import config
    from bench.fast_recipe import RECIPE, VARIANTS

    recipe = config.load(RECIPE, [])
    for name, overrides in VARIANTS.items():
        cfg = config.load(RECIPE, overrides)
        assert (cfg == recipe) == (not overrides), name
