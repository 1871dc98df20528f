"""Engine overhead: our Ignite trainer vs a bare PyTorch loop doing the same math.

Same model, same batches held in memory, same AMP and accumulation, same clipping/grad-norm and
per-update scheduler step; the two run alternately in one process. Prints the ratio last
(goal <= 1.05, ideally <= 1.03).

    .venv/bin/python bench/engine_overhead.py [--model test_resnet] [--amp off|bf16] [--rounds 7]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from accel import engine as E  # noqa: E402
from bench.common import print_ratio, summary, time_rounds  # noqa: E402


def contenders(args, data: list) -> dict:
    """accel's Ignite update step and a bare PyTorch loop doing the same updates on `data`."""
    import timm

    device = torch.device("cpu")
    dtype = torch.bfloat16 if args.amp == "bf16" else None
    k, n = args.accumulation, len(data)

    def setup():
        torch.manual_seed(0)
        model = timm.create_model(args.model, num_classes=10)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        updates = math.ceil(n / k)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda u: E.lr_multiplier(u, total=updates, warmup=0, kind="cosine")
        )
        return model, optimizer, scheduler

    def ours():
        model, optimizer, scheduler = setup()
        step = E.UpdateStep(
            model,
            optimizer,
            nn.CrossEntropyLoss(),
            device,
            accumulation_steps=k,
            amp_dtype=dtype,
            scheduler=scheduler,
        )
        E.create_trainer(step).run(data, max_epochs=1)

    def bare():
        model, optimizer, scheduler = setup()
        loss_fn = nn.CrossEntropyLoss()
        model.train()
        for i, (x, y) in enumerate(data):
            start = i - i % k
            window = min(k, n - start)
            with E.autocast(device, dtype):
                loss = loss_fn(model(x), y)
            (loss / window).backward()
            if i == start + window - 1:
                torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()

    return {"accel (Ignite)": ours, "bare PyTorch": bare}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="test_resnet")
    ap.add_argument("--amp", default="off", choices=["off", "bf16"])
    ap.add_argument("--batches", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--img-size", type=int, default=32)
    ap.add_argument("--accumulation", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()

    g = torch.Generator().manual_seed(0)
    data = [
        (
            torch.randn(args.batch_size, 3, args.img_size, args.img_size, generator=g),
            torch.randint(0, 10, (args.batch_size,), generator=g),
        )
        for _ in range(args.batches)
    ]
    k, n = args.accumulation, len(data)
    print(
        f"{args.model} {args.img_size}px batch {args.batch_size} x{k} accumulation, "
        f"{n} micro-batches/round, amp={args.amp}, {torch.get_num_threads()} threads"
    )
    times = time_rounds(contenders(args, data), args.rounds)
    for name, ts in times.items():
        print(f"{name:15s} {summary(ts)}")
    print_ratio(
        times, "accel (Ignite)", "bare PyTorch", "engine overhead ratio (accel / bare)", ".3f"
    )


if __name__ == "__main__":
    main()
