"""The update step never makes the host wait for the device in steady state: a `.item()` (or a
`bool`, `float`, `int`, `tolist`) on a device tensor per update serialises a GPU, since the
host cannot queue the next update's kernels while it waits. On the CPU the reads are counted
(checks/gpu/syncs.py); `make gpu-check` counts the CUDA syncs too."""

from __future__ import annotations

import pytest
import torch

from checks.gpu import syncs

CPU = torch.device("cpu")
UPDATES = 30


def batch(n: int = 4, side: int = 16):
    """A small batch: what is counted is the reads per update, not the work of one."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, side, side, generator=g), torch.randint(0, 10, (n,), generator=g)


# make test covers it: bf16's step: [1-bf16]; accumulation's: [3-off] (both: test-all)
@pytest.mark.parametrize("amp,accumulation", [
    ("off", 1), ("bf16", 1), ("off", 3), pytest.param("bf16", 3, marks=pytest.mark.slow)],
    ids=lambda v: str(v))
def test_the_update_step_reads_no_tensor_value_in_steady_state(amp, accumulation):
    """AdamW, clipping, a schedule and a moving average, with and without accumulation."""
    torch.manual_seed(0)
    step = syncs.make_step(amp, CPU, "test_resnet", accumulation=accumulation)
    reads = syncs.step_reads(step, batch(), UPDATES)
    assert step.updates == UPDATES + 3  # the warm-up's and the counted updates all happened
    assert dict(reads) == {}, f"host reads in {UPDATES} updates: {dict(reads)}"


def test_the_count_sees_one_read_per_update():
    """The counter is not blind: a step that reads its loss once per update is caught."""
    torch.manual_seed(0)
    step = syncs.make_step("off", CPU, "test_resnet")

    class Reading:
        def __init__(self, inner):
            self.inner, self.accumulation_steps, self.device = inner, 1, inner.device

        def __call__(self, engine, b):
            out = self.inner(engine, b)
            out["loss"].item()  # what a logging line per batch would do
            return out

    reads = syncs.step_reads(Reading(step), batch(), UPDATES)
    assert reads["item"] == UPDATES


def test_the_count_leaves_out_the_optimizers_host_counters():
    """torch.optim keeps an optimizer's step count on the host: its reads are not syncs; a read
    of the same kind of tensor by other code is counted."""
    counter = torch.tensor(3.0)
    with syncs.count_reads(CPU) as reads:
        float(counter)
    assert reads["__float__"] == 1
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)  # reads its step with .item()
    model(torch.ones(1, 2)).sum().backward()
    with syncs.count_reads(CPU) as reads:
        opt.step()
    assert dict(reads) == {}


# make test covers it: bf16's step: test_the_update_step_reads_no_tensor_value_in_steady_state
# [bf16-1]; the trainer and its handlers around a step: [off] and [fp16] here
@pytest.mark.parametrize("amp", ["off", pytest.param("bf16", marks=pytest.mark.slow), "fp16"])
def test_the_trainer_with_its_handlers_and_the_progress_bar_reads_nothing_more(amp, monkeypatch):
    """accel's trainer around the step (no per-update NaN check: the epoch's summed loss is
    checked at its end), with the moving average and the progress bar a terminal gets. fp16
    reads nothing either: its fused optimizer skips an inf/NaN update on the device, and the
    moving average and the epoch's sums weigh the skip there too."""
    import sys

    from accel.train import epochs

    torch.manual_seed(0)
    step = syncs.make_step(amp, CPU, "test_resnet")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    bars = []
    reads, _ = syncs.trainer_reads(step, batch(), UPDATES,
                                   attach=lambda t: bars.append(epochs.progress_bar(t)))
    assert bars == [True]
    assert dict(reads) == {}, f"host reads in {UPDATES} updates: {dict(reads)}"


def test_the_moving_average_neither_reads_nor_moves_its_counter_and_matches_torchs():
    """Its counter stays a host tensor (no `.to(device)` per update, no read), and its weights
    equal torch's AveragedModel's EMA bit for bit."""
    import timm
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from accel.engine import moving_average

    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=10)
    ours = moving_average(model, 0.9)
    theirs = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    moves = []
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        moves.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    for i in range(4):
        model(batch()[0]).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        theirs.update_parameters(model)
        with syncs.count_reads(CPU) as reads:
            torch.Tensor.to = to
            try:
                ours.update_parameters(model)
            finally:
                torch.Tensor.to = original
        if i:  # after the first update: the steady state
            assert dict(reads) == {} and moves == [], (dict(reads), moves)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(),
                                                 theirs.state_dict().values(), strict=True))
    assert ours.n_averaged.device.type == "cpu" and int(ours.n_averaged) == 4
