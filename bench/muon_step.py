"""What an update of the fast recipe's network costs with Nesterov SGD (experiments/
cifar10_fast.yaml) and with Muon (experiments/cifar10_fast_muon.yaml: Newton-Schulz in bf16,
airbench94_muon's precision, and in fp32, that file's), side by side on the CPU:

    .venv/bin/python bench/muon_step.py [--rounds 7] [--updates 5] [--batch 256]

Each contender is the optimizer accel builds for its recipe (`engine.build_optimizer`) over
its own copy of the network (accel_cnn_m behind the whitening layer), stepping `--updates`
times a round on the same fixed gradients: the data plays no part in an update's cost, so none
is read. One forward and backward pass of a `--batch` of random images (fp32, channels_last,
as the recipe trains where auto picks fp32) is timed beside them, for scale. The contenders
alternate round by round (bench/common.py). Printed: the CPU (`lscpu`'s model name and its bf16
flags), torch and its threads; each contender's median per update; the median ratio of each
Muon to Nesterov SGD, and of each update to the forward and backward pass, with the per-round
spread.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import cpu_line, print_ratio, summary, time_rounds  # noqa: E402

RECIPE = "experiments/cifar10_fast.yaml"
MUON_RECIPE = "experiments/cifar10_fast_muon.yaml"
CONTENDERS = {  # name -> (recipe, overrides)
    "nesterov": (RECIPE, []),
    "muon bf16": (MUON_RECIPE, ["train.muon_ns_dtype=bf16"]),
    "muon fp32": (MUON_RECIPE, ["train.muon_ns_dtype=fp32"]),
}
PASS = "forward+backward"


def network(recipe: str, overrides: list[str]):
    """(the recipe's network, untrained, on the CPU; its config)."""
    from accel import config, models

    cfg = config.load(recipe, [*overrides, "train.device=cpu"])
    model = models.build_model(cfg, num_classes=10, in_chans=3, img_size=32)
    return model.to(memory_format=torch.channels_last), cfg


def updates(recipe: str, overrides: list[str], n: int) -> Callable[[], None]:
    """`n` updates of the recipe's optimizer on fixed gradients (the same for every
    contender: one seed)."""
    from accel import engine

    model, cfg = network(recipe, overrides)
    optimizer = engine.build_optimizer(model, cfg.train)
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=gen).contiguous(memory_format=layout(p))

    def run() -> None:
        for _ in range(n):
            optimizer.step()

    return run


def layout(p: torch.Tensor) -> torch.memory_format:
    """A gradient in its parameter's layout (channels_last filters), as backward makes it."""
    last = p.ndim == 4 and p.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if last else torch.contiguous_format


def forward_backward(batch: int) -> Callable[[], None]:
    model, _ = network(RECIPE, [])
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, 32, 32, generator=gen).contiguous(
        memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), generator=gen)

    def run() -> None:
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--updates", type=int, default=5, help="updates per contender per round")
    ap.add_argument("--batch", type=int, default=256, help="the forward+backward's images")
    args = ap.parse_args()
    from accel.train import memory

    memory.keep_freed_memory(True)  # as a run of the recipe on a CPU does
    contenders = {name: updates(recipe, extra, args.updates)
                  for name, (recipe, extra) in CONTENDERS.items()}
    contenders[PASS] = forward_backward(args.batch)
    print(f"{cpu_line()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"{args.rounds} rounds of {args.updates} updates each, one forward+backward of "
          f"{args.batch} images (fp32)", flush=True)
    times = time_rounds(contenders, args.rounds)
    for name in CONTENDERS:
        times[name] = [t / args.updates for t in times[name]]  # seconds per update
    for name, t in times.items():
        what = "a pass" if name == PASS else "an update"
        print(f"  {name:17s} {what:9s} {summary(t)}")
    for name in ("muon bf16", "muon fp32"):
        print_ratio(times, name, "nesterov", f"update time {name} / nesterov", ".2f")
    for name in CONTENDERS:
        print_ratio(times, name, PASS, f"update {name} / forward+backward", ".3f")


if __name__ == "__main__":
    main()
