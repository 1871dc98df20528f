"""`train.compile`: off, or a torch.compile mode (default, reduce-overhead for CUDA graphs,
max-autotune); true and false still mean default and off. The CPU path trains here; the CUDA
modes are measured by `make gpu-check` (checks/gpu/paper.py)."""

from __future__ import annotations

import pytest
import torch

from accel import config, models
from accel.config import ConfigError
from accel.train import train
from tests.conftest import run_in_process


@pytest.mark.parametrize(("given", "mode"), [("true", "default"), ("false", "off"),
                                             ("off", "off"), ("default", "default"),
                                             ("reduce-overhead", "reduce-overhead"),
                                             ("max-autotune", "max-autotune")])
def test_each_mode_is_a_config_value(given, mode):
    assert config.load(None, [f"train.compile={given}"]).train.compile == mode


def test_an_unknown_mode_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError, match=r"train.compile='fast' is not one of: off, default, "
                                          r"reduce-overhead, max-autotune"):
        config.load(None, ["train.compile=fast"])
    done = run_in_process("train", "train.compile=fast")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "reduce-overhead" in done.stderr


@pytest.mark.parametrize(("mode", "passed"), [("default", None), ("reduce-overhead",
                                                                  "reduce-overhead"),
                                              ("max-autotune", "max-autotune")])
def test_the_mode_reaches_torch_compile(mode, passed, monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: seen.append(mode) or model)
    cfg = config.load(None, [f"train.compile={mode}"])
    model = models.prepare_model(torch.nn.Linear(2, 2), cfg, torch.device("cpu"))
    assert isinstance(model, torch.nn.Linear) and seen == [passed]
    seen.clear()
    models.prepare_model(torch.nn.Linear(2, 2), config.load(None, ["train.compile=off"]),
                         torch.device("cpu"))
    assert seen == []


@pytest.mark.slow  # inductor compiles C++ kernels: a minute or two on 2 cores
def test_a_compiled_run_trains_as_the_eager_one_on_cpu(tiny_overrides):
    """The same seed, compiled (default mode: inductor's C++ kernels) and eager: the same losses
    within float error, and dynamo did compile graphs."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    small = [*tiny_overrides, "model.name=accel_cnn_s", "model.img_size=8", "train.epochs=2"]
    runs = {mode: train(config.load(None, [*small, f"train.compile={mode}"]), track=False)
            for mode in ("off", "default")}
    assert counters["stats"]["unique_graphs"] >= 1
    for eager, compiled in zip(runs["off"].history, runs["default"].history, strict=True):
        assert compiled["train_loss"] == pytest.approx(eager["train_loss"], rel=1e-3, abs=1e-4)
        assert compiled["val_accuracy"] == pytest.approx(eager["val_accuracy"], abs=0.02)
