"""What the time split costs: accel's trainer with the epoch's clock (accel.timing) against the
same trainer whose clock does nothing, side by side in one process, alternating round by round.

The clock takes two readings per batch in the loader and three per micro-batch in the update
step (perf_counter on a CPU, CUDA events on a GPU); the goal is a ratio under 1.02. A tiny model
makes the step short, so the readings weigh the most there (the default); `--model accel_cnn_m`
is the fast recipe's network.

    .venv/bin/python bench/split_cost.py [--model test_resnet] [--rounds 9] [--batches 48]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from accel import engine as E  # noqa: E402
from accel.timing import EpochClock  # noqa: E402
from accel.tracking.environment import cpu_name  # noqa: E402
from accel.train.loader import Batches  # noqa: E402
from bench.common import print_ratio, summary, time_rounds  # noqa: E402


class StoppedClock(EpochClock):
    """The clock's interface, reading nothing: the trainer without the split."""

    def _mark(self):
        return 0.0

    def waited(self, seconds: float) -> None:
        pass

    def step_started(self) -> None:
        pass

    def copied(self) -> None:
        pass

    def step_ended(self) -> None:
        pass


def contenders(args, loader) -> dict:
    import timm

    import accel.nets  # noqa: F401 (accel's own networks, by name)

    device = torch.device("cpu")

    def epoch(clock: EpochClock):
        torch.manual_seed(0)
        model = timm.create_model(args.model, num_classes=10)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
        step = E.UpdateStep(model, optimizer, nn.CrossEntropyLoss(), device, clock=clock)
        batches = Batches(loader, clock)
        clock.start()
        E.create_trainer(step).run(batches, max_epochs=1)
        clock.training_split()  # what the run reads at the epoch's end

    return {"clock on": lambda: epoch(EpochClock(device)),
            "clock off": lambda: epoch(StoppedClock(device))}


def clock_cost_s(calls: int = 200_000) -> float:
    """Seconds the clock itself takes per micro-batch (the loader's wait, the step's three
    marks), timed over many calls: the side-by-side rounds cannot resolve a cost this small
    from their own round-to-round spread."""
    import time

    clock = EpochClock(torch.device("cpu"))
    began = time.perf_counter()
    for _ in range(calls):
        waited = time.perf_counter()
        clock.waited(time.perf_counter() - waited)
        clock.step_started()
        clock.copied()
        clock.step_ended()
    return (time.perf_counter() - began) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="test_resnet")
    ap.add_argument("--batches", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--img-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()

    g = torch.Generator().manual_seed(0)
    n = args.batches * args.batch_size
    images = torch.randn(n, 3, args.img_size, args.img_size, generator=g)
    dataset = torch.utils.data.TensorDataset(images, torch.randint(0, 10, (n,), generator=g))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"{args.model} {args.img_size}px batch {args.batch_size}, {args.batches} micro-batches "
          f"a round, {args.rounds} rounds")
    times = time_rounds(contenders(args, loader), args.rounds)
    for name, ts in times.items():
        print(f"{name:10s} {summary(ts)}")
    print_ratio(times, "clock on", "clock off", "split cost ratio (on / off; goal < 1.02)", ".4f")
    per_batch = clock_cost_s()
    step = statistics.median(times["clock off"]) / args.batches
    print(f"the clock alone: {per_batch * 1e6:.2f} us a micro-batch, {100 * per_batch / step:.4f}%"
          f" of a {step * 1000:.1f} ms micro-batch (goal < 2%)")


if __name__ == "__main__":
    main()
