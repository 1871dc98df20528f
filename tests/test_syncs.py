"""The update step never makes the host wait for the device in steady state: a `.item()` (or a
`bool`, `float`, `int`, `tolist`) on a device tensor per update serialises a GPU, since the
host cannot queue the next update's kernels while it waits. On the CPU the reads are counted
(bench/gpu/syncs.py); `make gpu-check` counts the CUDA syncs too."""

from __future__ import annotations

import pytest
import torch

from bench.gpu import syncs

CPU = torch.device("cpu")
UPDATES = 30


def batch(n: int = 8):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


@pytest.mark.parametrize("amp", ["off", "bf16"])
@pytest.mark.parametrize("accumulation", [1, 3])
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
