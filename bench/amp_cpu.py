"""bf16 autocast speed-up on CPU through accel's engine (fp32 vs bf16, same batches, alternating).

    .venv/bin/python bench/amp_cpu.py [--model resnet18] [--img-size 32] [--rounds 5]

Prints the speed-up (fp32 time / bf16 time) last; the goal on a CPU with bf16 units is >= 1.25x.
A round whose loss went NaN is reported. The bf16 model gets accel's guard for one-pixel convs
(bench/bf16_cpu_conv.py), as `accel train train.amp=bf16` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from accel import engine as E  # noqa: E402
from bench.common import print_ratio, summary, time_rounds  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--img-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import timm

    device = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    data = [
        (
            torch.randn(args.batch_size, 3, args.img_size, args.img_size, generator=g),
            torch.randint(0, 10, (args.batch_size,), generator=g),
        )
        for _ in range(args.batches)
    ]
    nonfinite = {"fp32": 0, "bf16": 0}

    def contender(name: str, dtype: torch.dtype | None):
        def run() -> None:
            torch.manual_seed(0)
            model = timm.create_model(args.model, num_classes=10)
            if dtype is torch.bfloat16:
                E.guard_cpu_bf16_convs(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            step = E.UpdateStep(model, optimizer, nn.CrossEntropyLoss(), device, amp_dtype=dtype)
            trainer = E.create_trainer(step)
            trainer.run(data, max_epochs=1)
            if trainer.state.iteration != len(data):  # stopped early on a NaN loss
                nonfinite[name] += 1

        return run

    print(
        f"{args.model} {args.img_size}px batch {args.batch_size}, {args.batches} steps/round, "
        f"{torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}"
    )
    times = time_rounds(
        {"fp32": contender("fp32", None), "bf16": contender("bf16", torch.bfloat16)}, args.rounds
    )
    for name, ts in times.items():
        print(f"{name:5s} {summary(ts)}  rounds stopped by NaN: {nonfinite[name]}")
    print_ratio(times, "fp32", "bf16", "bf16 speed-up, times (fp32 / bf16)", ".2f")


if __name__ == "__main__":
    main()
