"""Time to 94% on CIFAR-10, on one GPU: airbench94 (its PyPI package, untouched) against accel's
fast recipe set to airbench's hyperparameters (checks.gpu.peer), same GPU, same JPEG pixels, same
process. airbench trains on all 50,000 images and is scored on the test set (its TTA); accel
holds 10% out to watch its val accuracy reach the target (time_to_target_s: training seconds,
evaluation excluded), tracked in MLflow as any run, and is scored on the same test set. Then,
while the budget lasts, the same settings with airbench94_muon's optimizer (side `accel muon`:
checks.gpu.peer_airbench.MUON, Newton-Schulz in bf16 on the GPU), the recipe that led the
parity recipe at equal epochs on the CPU (docs/results.md).

    python -m checks.gpu.fast --target 0.94         # on the GPU (`make gpu-check`)
    python -m checks.gpu.fast --dry-run             # on the CPU: one update of each, digits
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from checks.gpu.records import emit

RECIPE = "experiments/cifar10_fast.yaml"
DRY_ACCEL = ("data.dataset=digits", "model.name=accel_cnn_s", "train.epochs=2",
             "train.device=cpu", "data.num_workers=0", "train.batch_size=32", "train.amp=off",
             "data.on_device=false", "data.flip=random", "model.whiten=0",
             "train.whiten_bias_epochs=null", "eval.tta=flip", "train.lr=0.2",
             "train.momentum=0.9", "train.warmup_epochs=0.5")  # airbench's lr diverges on digits


def airbench_runs(data: Path, seeds: int, dry: bool, deadline: float) -> None:
    """A warm-up (cuDNN's kernel choice, as airbench's README asks), then `seeds` runs."""
    from checks.gpu import peer

    device, epochs, batch = ("cpu", 1.0, 128) if dry else ("cuda", None, None)
    if not dry:
        peer.train_on(data, device, seed=-1, epochs=1.0, tta_level=0)
    for seed in range(seeds):
        if time.monotonic() > deadline:
            break
        got = peer.train_on(data, device, seed=seed, epochs=epochs, batch_size=batch)
        emit(step="fast", side="airbench94", seed=seed, seconds=got["seconds"],
             test_acc=got["test_acc"], notes=f"{got['epochs']} epochs of "
             f"{got['train_images']} images, batch {batch or 1024}, "
             f"{'fp32 on the CPU' if dry else 'fp16'}, TTA level 2")


def _accel_overrides(dry: bool, data_root: Path) -> list[str]:
    from checks.gpu.peer import accel_overrides

    return [*accel_overrides(), *DRY_ACCEL] if dry else [
        *accel_overrides(), f"data.root={data_root}", "train.device=cuda", "train.amp=bf16",
        "data.val_fraction=0.1"]


def accel_warm_up(data_root: Path) -> None:
    """accel's warm-up, as airbench gets one: a short untracked run (cuDNN's kernel choice, the
    resident data decoded), so the first timed seed does not pay for them."""
    from accel import config
    from accel.train import train

    train(config.load(RECIPE, [*_accel_overrides(False, data_root), "train.epochs=1",
                               "train.epoch_length=20"]), track=False)


def muon_overrides(dry: bool) -> tuple[str, ...]:
    """airbench94_muon's optimizer on the parity settings; its Newton-Schulz in bf16 on a GPU."""
    from checks.gpu.peer_airbench import MUON

    return MUON if dry else (*MUON, "train.muon_ns_dtype=bf16")


def accel_run(seed: int, target: float, dry: bool, data_root: Path, side: str = "accel",
              extra: tuple[str, ...] = ()) -> None:
    from accel import config
    from accel.train import train
    from accel.train.epochs import time_to_target

    cfg = config.load(RECIPE, [*_accel_overrides(dry, data_root), f"train.seed={seed}",
                               "train.stop_at_target=true",
                               f"train.target={{metric: val_accuracy, value: {target}}}", *extra])
    result = train(cfg, run_name=f"fast {side} seed {seed}", tags={"accel.gpu_check": "fast"})
    hit = time_to_target(cfg.train.target, result.history)
    emit(step="fast", side=side, seed=seed, seconds=result.costs["train_time_s"],
         test_acc=result.metrics.get("test_accuracy", float("nan")),
         time_to_target_s=hit[0] if hit else None,
         notes=f"{result.epochs} epochs, run {result.run_id}, batch {cfg.train.batch_size}, "
               f"{cfg.train.amp}{mfu_said(result.splits)}")


def mfu_said(splits: list[dict]) -> str:
    """`, MFU 0.31 (0.29-0.33)` over the epochs after the first (accel.timing)."""
    values = [s["mfu"] for s in splits[1:] or splits if "mfu" in s]
    if not values:
        return ""
    return f", MFU {sorted(values)[len(values) // 2]:.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, tiny")
    ap.add_argument("--target", type=float, default=0.94, help="val accuracy to reach")
    ap.add_argument("--seeds", type=int, default=3, help="airbench94 runs")
    ap.add_argument("--budget", type=float, default=90, help="seconds for starting new runs")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.budget
    from accel.shared_data import cifar10_jpeg
    from checks.gpu.cifar import write_airbench

    root = Path(os.environ["ACCEL_DATA"]) if os.environ.get("ACCEL_DATA") else cifar10_jpeg()
    work = Path(os.environ.get("ACCEL_WORK") or root.parent) / "airbench"
    limits = (256, 200) if args.dry_run else (None, None)
    data = write_airbench(root, work / "cifar10", *limits)
    airbench_runs(data, 1 if args.dry_run else args.seeds, args.dry_run, deadline)
    if not args.dry_run:
        accel_warm_up(root)
    for seed in range(args.seeds):
        if seed and time.monotonic() > deadline:
            break
        accel_run(seed, args.target, args.dry_run, root)
        if args.dry_run:
            break
    for seed in range(1 if args.dry_run else args.seeds):  # the Muon arm: only within the budget
        if time.monotonic() > deadline:
            break
        accel_run(seed, args.target, args.dry_run, root, "accel muon",
                  muon_overrides(args.dry_run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
