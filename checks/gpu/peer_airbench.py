"""Fidelity with airbench94 at equal epochs, on the CPU: airbench94's own training (PyPI
`airbench==0.1.8`, moved to the CPU by checks/gpu/peer.py: fp32, or bf16 autocast where its fp16
cannot run) against accel's fast recipe set to airbench's hyperparameters
(`checks.gpu.peer.AIRBENCH_OVERRIDES`: batch 1024, lr, momentum, decay, triangle, label
smoothing, BatchNorm, whitening bias held after 3 epochs, the Lookahead written back, decayed
biases), on the same JPEG CIFAR-10 (all 50,000
training images, scored on the 10,000 test images, both with multi-crop TTA), seed by seed.

Per seed: each side's test accuracy and training seconds; then the mean difference accel -
airbench94 with its paired 95% Student-t interval (accel.verify.stats). What stays different
between the two is listed in checks/gpu/peer.py and printed with the table.

With `--muon` each seed also trains accel at the same settings but for the optimizer
(`MUON`: airbench94_muon's Muon on the filters, Nesterov SGD for the rest, accel/muon.py),
and a second table gives Muon - the parity recipe, paired by seed.

    make gpu-wheels                                  # builds the airbench wheel into .gpu/wheels
    python -m checks.gpu.peer_airbench --seeds 3     # the full comparison: about an hour on an
                                                     # idle 2-core machine
    python -m checks.gpu.peer_airbench --seeds 2 --epochs 1 --train-limit 2048
                                                     # a rehearsal (minutes)
    python -m checks.gpu.peer_airbench --seeds 3 --epochs 4 --muon
                                                     # and Muon beside the parity recipe
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from checks.common import ROOT

RECIPE = ROOT / "experiments" / "cifar10_fast.yaml"
# airbench94_muon's optimizer (experiments/cifar10_fast_muon.yaml), all else the parity recipe's:
# the two arms differ in the optimizer alone. Newton-Schulz in fp32: bf16 is emulated on some CPUs.
MUON = ("train.optimizer=muon", "train.muon_lr=0.24", "train.muon_momentum=0.6",
        "train.muon_ns_steps=3", "train.muon_ns_dtype=fp32", "train.muon_renorm=true",
        "train.muon_rest=nesterov")


def accel_run(root: Path, seed: int, amp: str, epochs: int, train_limit: int | None,
              extra: tuple[str, ...] = ()) -> dict:
    """accel's recipe at airbench's hyperparameters (then `extra`) on the training images
    airbench gets (all, or the same `train_limit`), none held out (checks.gpu.cifar.peer_tree),
    untracked."""
    from accel import config
    from accel.train import train
    from checks.gpu.cifar import peer_tree
    from checks.gpu.peer import accel_overrides

    data = peer_tree(root, train_limit)
    cfg = config.load(RECIPE, [*accel_overrides(epochs), f"data.root={data}", "train.device=cpu",
                               f"train.amp={amp}", "data.val_fraction=0", "train.target={}",
                               f"train.seed={seed}", *extra])
    result = train(cfg, track=False)
    return {"test_acc": result.metrics["test_accuracy"],
            "seconds": result.costs["train_time_s"]}


def airbench_run(data: Path, seed: int, amp: str, epochs: float) -> dict:
    from checks.gpu import peer

    return peer.train_on(data, "cpu", seed=seed, amp=amp, epochs=epochs)


def report(rows: list[dict], args) -> None:
    from accel.verify.stats import paired_difference
    from checks.gpu import peer

    print(f"\nairbench94 ({args.airbench_epochs} epochs) and accel ({args.epochs} epochs), "
          f"{args.amp}, CPU, JPEG CIFAR-10\n")
    print("| seed | airbench94 test | accel test | accel - airbench94 | airbench94 s | accel s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['seed']} | {r['air']['test_acc']:.4f} | {r['accel']['test_acc']:.4f} | "
              f"{r['accel']['test_acc'] - r['air']['test_acc']:+.4f} | "
              f"{r['air']['seconds']:.0f} | {r['accel']['seconds']:.0f} |")
    a = [r["air"]["test_acc"] for r in rows]
    b = [r["accel"]["test_acc"] for r in rows]
    print(f"\nmean: airbench94 {statistics.mean(a):.4f}, accel {statistics.mean(b):.4f}")
    if len(rows) >= 2:
        d = paired_difference(b, a)
        print(f"accel - airbench94: {d.mean:+.4f} (paired 95% interval {d.low:+.4f} .. "
              f"{d.high:+.4f}, {len(rows)} seeds)")
    else:
        print("accel - airbench94: one seed, no interval (use --seeds 3)")
    if "muon" in rows[0]:
        muon_table(rows)
    print("\nWhat stays different from airbench94:")
    for line in peer.DIFFERENCES:
        print(f"- {line}")


def muon_table(rows: list[dict]) -> None:
    from accel.verify.stats import paired_difference

    print("\nMuon (airbench94_muon's optimizer) against the parity recipe, equal epochs\n")
    print("| seed | parity test | Muon test | Muon - parity | parity s | Muon s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['seed']} | {r['accel']['test_acc']:.4f} | {r['muon']['test_acc']:.4f} | "
              f"{r['muon']['test_acc'] - r['accel']['test_acc']:+.4f} | "
              f"{r['accel']['seconds']:.0f} | {r['muon']['seconds']:.0f} |")
    if len(rows) >= 2:
        d = paired_difference([r["muon"]["test_acc"] for r in rows],
                              [r["accel"]["test_acc"] for r in rows])
        print(f"\nMuon - parity: {d.mean:+.4f} (paired 95% interval {d.low:+.4f} .. "
              f"{d.high:+.4f}, {len(rows)} seeds)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m checks.gpu.peer_airbench",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--amp", choices=("off", "bf16"), default="off",
                    help="off: fp32; bf16: autocast on both sides")
    ap.add_argument("--epochs", type=int, default=10, help="accel's epochs (whole numbers)")
    ap.add_argument("--airbench-epochs", type=float, default=None,
                    help="airbench's (default: its own 9.9; with --epochs set lower, that)")
    ap.add_argument("--train-limit", type=int, default=None, help="training images (all)")
    ap.add_argument("--muon", action="store_true",
                    help="also train accel with Muon (MUON) each seed, and compare")
    args = ap.parse_args(argv)
    if args.airbench_epochs is None:
        args.airbench_epochs = 9.9 if args.epochs == 10 else float(args.epochs)
    from accel.shared_data import cifar10_jpeg
    from checks.gpu.cifar import write_airbench

    root = cifar10_jpeg()
    data = write_airbench(root, root.parent / "airbench" / "cifar10", args.train_limit)
    rows = []
    for seed in range(args.seeds):
        began = time.perf_counter()
        air = airbench_run(data, seed, args.amp, args.airbench_epochs)
        ours = accel_run(root, seed, args.amp, args.epochs, args.train_limit)
        rows.append({"seed": seed, "air": air, "accel": ours})
        if args.muon:
            rows[-1]["muon"] = accel_run(root, seed, args.amp, args.epochs, args.train_limit, MUON)
        muon = f", Muon {rows[-1]['muon']['test_acc']:.4f}" if args.muon else ""
        print(f"seed {seed}: airbench94 {air['test_acc']:.4f}, accel {ours['test_acc']:.4f}{muon} "
              f"({time.perf_counter() - began:.0f} s)", file=sys.stderr, flush=True)
    report(rows, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
