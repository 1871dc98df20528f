"""CPU threads, OpenMP's wait policy and bf16 autocast vs fp32, side by side, for the quickstart
and a short CIFAR-10 run (experiments/cifar10_cpu.yaml on 2,048 images, one epoch).

    .venv/bin/python bench/threads.py [--rounds 2] [--skip-cifar]

Each setting is a fresh `accel train` process with OMP_NUM_THREADS and OMP_WAIT_POLICY set in
its environment (torch takes its thread count from OMP_NUM_THREADS), the settings alternating
round by round. Printed: one markdown table per config with the training time (sum of
epoch_time_s; data loading included, evaluation not) and the best val_accuracy, median
(min-max) over rounds, and the ratio to the 2-thread fp32 default. CIFAR-10 needs the shared
copy extracted (`python -m accel.shared_data`).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.quickstart import new_store, run_once, spread  # noqa: E402

CONFIGS = {
    "quickstart": [],
    "cifar10_cpu (2,048 images, 1 epoch)": [
        "experiments/cifar10_cpu.yaml", "data.train_limit=2048", "data.val_fraction=0.02",
        "data.in_memory=false", "train.epochs=1", "tracking.system_metrics=false"],
}
THREADS = ("2", "1")
WAIT_POLICIES = ("", "PASSIVE")  # "": OpenMP's default (spin a while, then sleep)
PRECISIONS = ("off", "bf16")
BASELINE = ("2", "", "off")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip-cifar", action="store_true")
    args = ap.parse_args()
    configs = {k: v for k, v in CONFIGS.items() if not (args.skip_cifar and "cifar" in k)}
    settings = list(itertools.product(THREADS, WAIT_POLICIES, PRECISIONS))
    with tempfile.TemporaryDirectory(prefix="accel-bench-") as tmp:
        for label, overrides in configs.items():
            store = new_store(Path(tmp) / label.split()[0])
            results: dict[tuple, list[dict[str, float]]] = {s: [] for s in settings}
            for r in range(args.rounds):
                for threads, policy, amp in settings:
                    env = {"OMP_NUM_THREADS": threads, "OMP_WAIT_POLICY": policy}
                    if not policy:
                        env.pop("OMP_WAIT_POLICY")
                    row = run_once([*overrides, f"train.amp={amp}"], store, env)
                    results[(threads, policy, amp)].append(row)
                    print(f"round {r + 1} {label} threads={threads} wait={policy or 'default'} "
                          f"amp={amp}: train {row['train_s']:.2f}s acc "
                          f"{row['best_val_accuracy']:.4f}", flush=True)
            report(label, results, args.rounds)


def report(label: str, results: dict, rounds: int) -> None:
    base = statistics.median(r["train_s"] for r in results[BASELINE])
    print(f"\n{label}: {rounds} rounds alternating, median (min-max)")
    print("| threads | OMP_WAIT_POLICY | precision | training s | vs 2 threads fp32 "
          "| best val_accuracy |")
    print("|---|---|---|---|---|---|")
    for (threads, policy, amp), rows in results.items():
        train_s = [r["train_s"] for r in rows]
        print(f"| {threads} | {policy or 'default'} | {'bf16' if amp == 'bf16' else 'fp32'} | "
              f"{spread(train_s)} | {statistics.median(train_s) / base:.2f}x | "
              f"{spread([r['best_val_accuracy'] for r in rows])} |")


if __name__ == "__main__":
    main()
