"""What a CPU training step of the fast recipe (experiments/cifar10_fast.yaml) spends beyond its
arithmetic, side by side:

    .venv/bin/python bench/cpu_step.py [--rounds 3] [--steps 40]

1. `train.keep_freed_memory` on (the default) and off: each round runs `accel train` of the
   recipe for 2 epochs of `--steps` batches (no TTA) in a fresh process per setting, alternating.
   Printed: the training time of the second epoch scaled to a full epoch of 45,000 images, and
   the process's minor page faults.
2. The whitening bias's gradient, kept (its first `train.whiten_bias_epochs`) and dropped (after
   them, one process): the recipe's update step in this process, timed over `--steps` batches
   per round, alternating.

Each part ends with the median ratio and the per-round spread. CIFAR-10 must be extracted
(`python -m accel.shared_data`).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import print_ratio, summary, time_rounds  # noqa: E402
from bench.quickstart import new_store, run_once  # noqa: E402

RECIPE = "experiments/cifar10_fast.yaml"
TRAIN_IMAGES = 45_000


def timed_run(overrides: list[str], store: str) -> tuple[float, int]:
    """(the last epoch's seconds, the child's minor page faults) of one `accel train`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    row = run_once(overrides, store)
    return row["last_epoch_s"], resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before


def allocator(rounds: int, steps: int, batch: int) -> None:
    common = [RECIPE, "train.epochs=2", "train.budget_s=null", f"train.epoch_length={steps}",
              "eval.tta=none",
              "tracking.system_metrics=false"]
    settings = {"kept": ["train.keep_freed_memory=true"],
                "handed back": ["train.keep_freed_memory=false"]}
    times: dict[str, list[float]] = {name: [] for name in settings}
    faults: dict[str, list[int]] = {name: [] for name in settings}
    scale = TRAIN_IMAGES / (steps * batch)
    with tempfile.TemporaryDirectory(prefix="accel-bench-") as tmp:
        store = new_store(Path(tmp) / "store")
        for r in range(rounds):
            for name, extra in settings.items():
                seconds, n = timed_run([*common, *extra], store)
                times[name].append(seconds * scale)
                faults[name].append(n)
                print(f"round {r + 1} freed memory {name}: {seconds * scale:.1f} s/epoch, "
                      f"{n} page faults", flush=True)
    print(f"\ntrain.keep_freed_memory, {rounds} rounds; median (min-max)")
    print("| freed memory | s per 45,000-image epoch | minor page faults (process) |")
    print("|---|---|---|")
    for name in settings:
        print(f"| {name} | {statistics.median(times[name]):.1f} ({min(times[name]):.1f}-"
              f"{max(times[name]):.1f}) | {statistics.median(faults[name]):,.0f} |")
    print_ratio(times, "kept", "handed back", "epoch time kept / handed back", ".2f")


def bias_gradient(rounds: int, steps: int) -> None:
    import torch

    from accel import config, models
    from accel.train import parts

    cfg = config.load(RECIPE, ["train.epoch_length=1000", "train.budget_s=null"])
    built = parts.build(cfg)
    loader = iter(built.data.train)
    batches = [next(loader) for _ in range(steps)]
    bias = models.whitening_layer(built.bare).bias

    class State:  # what UpdateStep reads of Ignite's engine
        epoch_length, iteration = 10**6, 0

    engine = type("Engine", (), {"state": State()})()

    def steps_with(grad: bool):
        def run() -> None:
            bias.requires_grad_(grad)
            bias.grad = None
            for i, batch in enumerate(batches, 1):
                engine.state.iteration = i
                built.step(engine, batch)
        return run

    times = time_rounds({"kept": steps_with(True), "dropped": steps_with(False)}, rounds)
    print(f"\nthe whitening bias's gradient, {steps} steps of {cfg.train.batch_size} images, "
          f"torch {torch.__version__}")
    for name, t in times.items():
        print(f"  {name:8s} {summary(t)}")
    print_ratio(times, "dropped", "kept", "step time dropped / kept", ".3f")
    built.data.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    allocator(args.rounds, args.steps, batch=256)
    bias_gradient(args.rounds, args.steps)


if __name__ == "__main__":
    main()
