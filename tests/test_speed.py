"""Where a run's time goes and how close it comes to its machine's peak: the FLOP count against a
hand count, the peak probe and its override, and every epoch's split (data, copy, compute,
evaluation, record) adding up to the epoch's wall time on the quickstart and the fast recipe."""

from __future__ import annotations

import pytest
import torch

from accel import config
from accel.config import ConfigError
from accel.flops import count_training_flops
from accel.timing import PARTS
from accel.train import peak as peak_probe
from accel.train import train
from tests.conftest import ROOT
from tests.test_experiments import keep_parts


def test_the_flop_count_of_a_plain_conv_net_is_the_hand_count():
    """3x3 conv 3->8 on 8x8, then a linear 512->10: forward 2*8*3*9*64 + 2*512*10; backward the
    conv's weight gradient (its input needs none) and the linear's input and weight gradients."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))
    conv, linear = 2 * 8 * 3 * 9 * 64, 2 * 512 * 10
    count = count_training_flops(net, (3, 8, 8))
    assert count.per_image == pytest.approx(2 * conv + 3 * linear, rel=0.01)
    assert count.heaviest_conv == (3, 8, (3, 3), (1, 1), (1, 1), 1, 8, 8)
    # A frozen conv gets no weight gradient, and then nothing needs the linear's input gradient.
    net[0].requires_grad_(False)
    assert count_training_flops(net, (3, 8, 8)).per_image == pytest.approx(conv + 2 * linear,
                                                                           rel=0.01)
    assert all(p.device.type == "cpu" and p.grad is None for p in net.parameters())
    # Counted once per structure and input; a wider network or a larger image is counted anew.
    net[0].requires_grad_(True)
    assert count_training_flops(net, (3, 8, 8)) == count
    wider = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10))
    assert count_training_flops(wider, (3, 8, 8)).per_image == pytest.approx(2 * count.per_image,
                                                                              rel=0.01)
    conv_only = torch.nn.Conv2d(3, 8, 3, padding=1)
    assert count_training_flops(conv_only, (3, 16, 16)).per_image == pytest.approx(
        4 * count_training_flops(conv_only, (3, 8, 8)).per_image, rel=0.01)


def test_the_peak_is_measured_once_then_cached_and_an_override_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(peak_probe.ENV, raising=False)
    cpu, conv = torch.device("cpu"), (8, 16, (3, 3), (1, 1), (1, 1), 1, 16, 16)
    drawn = torch.get_rng_state()
    measured = peak_probe.peak(cpu, None, conv)
    assert torch.equal(torch.get_rng_state(), drawn)  # the run's random stream is untouched
    assert measured.how == "measured" and measured.tflops > 0 and measured.vendor_tflops is None
    assert measured.tflops == max(measured.matmul_tflops, measured.conv_tflops)
    assert peak_probe.peak(cpu, None, conv).how == "cached"
    monkeypatch.setenv(peak_probe.ENV, "2.5")
    assert (peak_probe.peak(cpu, None, conv).tflops, peak_probe.peak(cpu, None, conv).how) \
        == (2.5, peak_probe.ENV)
    monkeypatch.setenv(peak_probe.ENV, "fast")
    with pytest.raises(ConfigError, match="ACCEL_PEAK_TFLOPS='fast' is not a peak"):
        peak_probe.peak(cpu, None, conv)


def test_a_run_that_outruns_every_probe_makes_its_rate_the_peak(tmp_path, monkeypatch):
    """A probe that reads below what the run achieves (small shapes, a busy machine): the run
    probes again and, where that reads low too, its own rate is the peak ("achieved"), logged
    and cached. No epoch's MFU is above 1."""
    from mlflow.tracking import MlflowClient

    from tests.conftest import new_store

    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(peak_probe.ENV, raising=False)
    probes = []

    def slow_probe(device, dtype, conv, channels_last, vendor):
        probes.append(conv)
        return peak_probe.Peak(1e-9, "measured", 1e-9, 1e-9, vendor)

    monkeypatch.setattr(peak_probe, "_probe", slow_probe)
    built, store = keep_parts(monkeypatch), new_store(tmp_path)
    cfg = config.load(ROOT / "experiments" / "quickstart.yaml",
                      ["train.epochs=2", "train.epoch_length=8", "train.amp=off",
                       f"tracking.uri={store}", "tracking.system_metrics=false"])
    result = train(cfg)
    run = built["parts"]
    fastest = max(split["achieved_tflops"] for split in run.splits)
    assert len(probes) == 2 and fastest > 1e-9  # at its start, then once when outrun
    assert all(0 < split["mfu"] <= 1.0 for split in run.splits)
    assert (run.peak.how, run.peak.tflops) == ("achieved", fastest)
    logged = MlflowClient(store).get_run(result.run_id).data
    assert logged.tags["accel.peak"] == "achieved"
    assert logged.metrics["peak_tflops"] == pytest.approx(fastest)
    cached = peak_probe.peak(torch.device("cpu"), None, run.flops.heaviest_conv)
    assert (cached.how, cached.tflops) == ("cached", fastest)


def test_a_listed_gpu_gets_its_data_sheet_figure_beside_the_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    cuda = torch.device("cuda")
    assert peak_probe.vendor_tflops(cuda, torch.bfloat16) == 989.4
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 PCIe")
    assert peak_probe.vendor_tflops(cuda, torch.float16) == 756.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA L4")
    assert peak_probe.vendor_tflops(cuda, torch.bfloat16) is None


def check_splits(run, epochs: int) -> None:
    """Every epoch's parts are measured, not made to add up: their sum is within 5% of the
    epoch's wall time, and the MFU is a share of the measured peak."""
    assert len(run.splits) == epochs
    for split in run.splits:
        wall = split["epoch_wall_s"]
        parts = {p: split[f"time_{p}_s"] for p in PARTS}
        assert all(parts[p] >= 0 for p in PARTS if p != "other"), parts
        assert parts["compute"] > 0 and parts["eval"] > 0, parts
        measured = sum(v for p, v in parts.items() if p != "other")
        assert measured == pytest.approx(wall, rel=0.05), parts
        assert 0 < split["mfu"] <= 1.0 and split["achieved_tflops"] < run.peak.tflops


def test_the_quickstarts_epochs_are_split_and_add_up(monkeypatch):
    built = keep_parts(monkeypatch)
    cfg = config.load(ROOT / "experiments" / "quickstart.yaml",
                      ["train.epochs=2", "train.epoch_length=8", "train.amp=off"])
    train(cfg, track=False)
    check_splits(built["parts"], 2)


def test_the_fast_recipes_epochs_are_split_and_add_up(monkeypatch, tiny_imagefolder):
    built = keep_parts(monkeypatch)
    cfg = config.load(ROOT / "experiments" / "cifar10_fast.yaml", [
        "data.dataset=imagefolder", f"data.root={tiny_imagefolder}", "data.num_workers=0",
        "data.train_limit=null", "train.budget_s=null", "train.epochs=2", "train.epoch_length=3",
        "train.batch_size=16", "train.amp=off", "train.device=cpu", "train.compile=false"])
    train(cfg, track=False)
    run = built["parts"]
    check_splits(run, 2)
    assert run.flops.per_image == pytest.approx(7.08e8, rel=0.01)  # airbench94's network
