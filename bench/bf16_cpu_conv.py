"""The oneDNN bf16 weight-gradient fault on CPU, in one convolution.

    .venv/bin/python bench/bf16_cpu_conv.py [--repeats 500] [--threads 1]

A 3x3 stride-2 convolution (padding 1) on a 1x1 input: the output sees only the kernel's centre
tap, so the weight gradient of the eight other taps is exactly zero. Under bf16 autocast on CPU,
oneDNN returns something else there: a different gradient on each repeat of the same inputs,
now and then NaN or inf. This is the conv that ends a ResNet fed 16 px images (timm's
test_resnet at the quickstart's size), where it was first seen as a NaN loss. Printed per way
of computing the same gradient: how many repeats were non-finite, how many had non-zero
off-centre taps, and how many differed from the fp32 reference by more than bf16 rounding.
accel runs such convs in fp32 under CPU autocast (`accel.engine.guard_cpu_bf16_convs`).
"""

from __future__ import annotations

import argparse
import platform
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from accel import engine as E  # noqa: E402


def weight_grad(conv: nn.Conv2d, x: torch.Tensor, bf16: bool) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = conv(x)
    return torch.autograd.grad(out.float().sum(), conv.weight)[0]


def count(conv, x, reference, repeats: int, bf16: bool) -> tuple[int, int, int]:
    off_centre = torch.ones(conv.kernel_size, dtype=torch.bool)
    off_centre[conv.kernel_size[0] // 2, conv.kernel_size[1] // 2] = False
    non_finite = nonzero = wrong = 0
    atol = 0.02 * float(reference.abs().max())  # far above bf16 rounding
    for _ in range(repeats):
        g = weight_grad(conv, x, bf16)
        non_finite += not bool(torch.isfinite(g).all())
        nonzero += bool(torch.count_nonzero(g[:, :, off_centre]))
        wrong += not torch.allclose(g, reference, rtol=0.02, atol=atol)
    return non_finite, nonzero, wrong


def cpu_name() -> str:
    info = Path("/proc/cpuinfo")  # Linux; elsewhere the architecture is what we can say
    lines = info.read_text().splitlines() if info.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--channels", type=int, default=192)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")  # oneDNN's TF32 note when its flags are toggled
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    conv = nn.Conv2d(args.channels, args.channels // 2, 3, stride=2, padding=1, bias=False)
    x = torch.randn(4, args.channels, 1, 1)
    reference = weight_grad(conv, x, bf16=False)

    print(f"torch {torch.__version__}, {cpu_name()}, "
          f"{torch.get_num_threads()} thread(s), {args.repeats} repeats of one conv "
          f"({args.channels}->{args.channels // 2}, 3x3, stride 2) on a 1x1 input")
    print("| way | non-finite | non-zero off-centre taps | wrong |")
    print("|---|---|---|---|")
    ways = {
        "fp32 (oneDNN)": (conv, False, True),
        "bf16 autocast (oneDNN)": (conv, True, True),
        "bf16 autocast, oneDNN off": (conv, True, False),
    }
    guarded = nn.Conv2d(args.channels, args.channels // 2, 3, stride=2, padding=1, bias=False)
    guarded.load_state_dict(conv.state_dict())
    E.guard_cpu_bf16_convs(guarded)
    ways["bf16 autocast, accel's guard"] = (guarded, True, True)
    for name, (module, bf16, onednn) in ways.items():
        with torch.backends.mkldnn.flags(enabled=onednn):
            non_finite, nonzero, wrong = count(module, x, reference, args.repeats, bf16)
        print(f"| {name} | {non_finite} | {nonzero} | {wrong} |")


if __name__ == "__main__":
    main()
