"""Whether the peak probe (accel/train/peak.py) reads the CPU's peak: its convolution, shaped
like the fast recipe's heaviest layer, at the batch it uses and at 8x and 64x that batch, and
its matrix multiply at 512, 1024 (what it uses in fp32) and 2048 wide, side by side with the
recipe's own forward and backward pass of `--batch` images (fp32, channels_last), whose rate is
its FLOPs (accel.flops) over its time:

    .venv/bin/python bench/peak_probe.py [--rounds 5] [--batch 256]

A probe that reads below the recipe's own pass is no peak: a run's MFU against it would pass 1
(the run then makes its own rate the peak: docs/mlflow.md#speed). The contenders alternate
round by round (bench/common.py). Printed: the CPU (`lscpu`'s model name and its bf16 flags),
torch and its threads; each contender's median time and TFLOPS; the median ratio of each
probe's time per FLOP to the recipe pass's, with the per-round spread (below 1: the probe
reads higher).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import cpu_line, print_ratio, summary, time_rounds  # noqa: E402
from bench.muon_step import forward_backward, network  # noqa: E402

RECIPE = "experiments/cifar10_fast.yaml"
PASS = "recipe pass"


def contenders(batch: int) -> tuple[dict, dict[str, float]]:
    """(name -> callable, name -> its FLOPs)."""
    from accel.flops import count_training_flops
    from accel.train import peak

    model, _ = network(RECIPE, [])
    count = count_training_flops(model, (3, 32, 32))
    cpu = torch.device("cpu")
    fns, flops = {PASS: forward_backward(batch)}, {PASS: count.per_image * batch}
    for scale in (1, 8, 64):
        fn, f, _ = peak._conv(cpu, None, count.heaviest_conv, True, target=1e9 * scale)
        fns[f"conv probe x{scale}"], flops[f"conv probe x{scale}"] = fn, f
    for n in (512, 1024, 2048):
        fn, f, _ = peak._matmul(cpu, None, n)
        fns[f"matmul {n}"], flops[f"matmul {n}"] = fn, f
    return fns, flops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256, help="the recipe pass's images")
    args = ap.parse_args()
    from accel.train import memory

    memory.keep_freed_memory(True)  # as a run of the recipe on a CPU does
    fns, flops = contenders(args.batch)
    print(f"{cpu_line()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"{args.rounds} rounds; fp32", flush=True)
    times = time_rounds(fns, args.rounds)
    per_flop = {name: [t / flops[name] for t in ts] for name, ts in times.items()}
    for name, ts in times.items():
        tflops = flops[name] / statistics.median(ts) / 1e12
        print(f"  {name:16s} {summary(ts)}  {tflops:.3f} TFLOPS")
    for name in fns:
        if name != PASS:
            print_ratio(per_flop, name, PASS, f"time per FLOP {name} / {PASS}", ".2f")


if __name__ == "__main__":
    main()
