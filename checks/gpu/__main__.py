"""The GPU check: what accel's techniques give on a CUDA machine, as one command and one report.

    make gpu-wheels                      # with network: fills .gpu/ (git-ignored), prints the size
    make gpu-check OUT=$OUT              # on the GPU machine: python3 -m checks.gpu $OUT
    .venv/bin/python -m checks.gpu --dry-run /tmp/gpu-check     # on a CPU: a rehearsal

The steps, in their order of value (checks/gpu/plan.py), each with its own timeout and all
within 480 s on the device, setup included:

1. paper      ResNet50, ViT-B/16 and EfficientNet-B0 at 224 px on CIFAR-10 held on the GPU:
              img/s and peak memory of accel's update step in fp32 (TF32 off), TF32, bf16, fp16 +
              GradScaler, channels_last; GA at the same effective batch; PM on the DataLoader
              path; train.compile on the fastest; ratios against fp32 and the published anchors;
2. fast       time to 94% CIFAR-10: airbench94 (its PyPI package, on the same JPEG pixels)
              against accel's fast recipe, tracked, in one process;
3. syncs      host-device synchronisations per update in steady state;
4. gpu_tests  the `gpu`-marked tests;
5. ablate     GA / AMP / PM / resident data on ResNet50, a CIFAR-10 subset, 2 epochs;
6. ddp        with two or more GPUs only: `accel ablate --techniques ddp,amp`.

It writes OUT/gpu_check.md (rewritten after every step, so a cut-short check leaves a report) and
OUT/<step>.log, and exits 1 if any step failed or timed out. `--dry-run` runs every step on this
CPU with tiny models and sizes (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The GPU machine's python3 lacks MLflow, Optuna and Ignite until setup installs them: these
# modules import the standard library at their top (torch and accel.shared_data where used).
from checks.gpu import carry, machine, plan, report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m checks.gpu",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=Path, help="folder for gpu_check.md and the logs")
    ap.add_argument("--dry-run", action="store_true", help="rehearse on CPU: no wheels, no CUDA")
    ap.add_argument("--prepare", action="store_true", help="here: fill .gpu/ (make gpu-wheels)")
    ap.add_argument("--steps", default="", metavar="NAMES",
                    help=f"run only these steps, comma-separated ({', '.join(plan.STEP_NAMES)}):"
                         " a rerun of what failed")
    args = ap.parse_args(argv)
    if args.prepare:
        return carry.prepare()
    if args.out is None:
        ap.error("OUT is required (the folder for gpu_check.md)")
    only = tuple(s for s in args.steps.split(",") if s)
    if set(only) - set(plan.STEP_NAMES):
        ap.error(f"--steps {args.steps}: unknown step(s); choose from "
                 f"{', '.join(plan.STEP_NAMES)}")
    if not args.dry_run:
        problem = machine.cuda_problem()
        if problem:
            return carry.fail(problem)
    return report.check(args.out, args.dry_run, only)


if __name__ == "__main__":
    sys.exit(main())
