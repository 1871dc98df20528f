"""The quickstart's `accel train` against the one it replaced, side by side.

    .venv/bin/python bench/quickstart.py [--rounds 3]

Each round runs, in turn, `accel train` (the default config, experiments/quickstart.yaml) and
`accel train model.name=resnet10t model.img_size=16 train.epochs=6` (the quickstart before:
resnet10t on digits upscaled to 16 px, 6 epochs), each a fresh process, as a user runs it. Each
contender logs to its own MLflow store, made before the first round (a store's one-time
creation, about 3 s here, is left out). Printed per contender: the command's wall time, the
time inside the run (data, model, epochs, evaluation, logging) and the training time (sum of
epoch_time_s), with the best val_accuracy; last, the ratios new / old (median over rounds,
min-max of the per-round ratios).
The goal: wall-time ratio <= 0.5 with best val_accuracy >= 0.97.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = {
    "new": [],
    "old": ["model.name=resnet10t", "model.img_size=16", "train.epochs=6"],
}
RUN_LINE = re.compile(r"^run (\w+): \d+ epochs in ([\d.]+)s", re.M)


def new_store(folder: Path) -> str:
    from mlflow.tracking import MlflowClient

    folder.mkdir()
    store = f"sqlite:///{folder / 'mlflow.db'}"
    MlflowClient(store).search_experiments()  # creates the tables
    return store


def run_once(overrides: list[str], store: str, env: dict[str, str] | None = None,
             ) -> dict[str, float]:
    """`accel train OVERRIDES` in a fresh process (with `env` added): its times and accuracy."""
    from mlflow.tracking import MlflowClient

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, **(env or {})}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "accel", "train", *overrides,
                           "--tracking-uri", store], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"accel train {' '.join(overrides)} failed:\n{proc.stderr[-2000:]}")
    run_id, in_run = RUN_LINE.search(proc.stdout).groups()
    client = MlflowClient(store)
    history = {key: [m.value for m in sorted(client.get_metric_history(run_id, key),
                                             key=lambda m: m.step)]
               for key in ("epoch_time_s", "val_accuracy")}
    return {"wall_s": wall, "run_s": float(in_run), "train_s": sum(history["epoch_time_s"]),
            "best_val_accuracy": max(history["val_accuracy"]),
            "last_epoch_s": history["epoch_time_s"][-1]}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in CONTENDERS}
    with tempfile.TemporaryDirectory(prefix="accel-bench-") as tmp:
        stores = {name: new_store(Path(tmp) / name) for name in CONTENDERS}
        for r in range(args.rounds):
            for name, overrides in CONTENDERS.items():
                results[name].append(run_once(overrides, stores[name]))
                print(f"round {r + 1} {name}: " + ", ".join(
                    f"{k}={v:.3f}" for k, v in results[name][-1].items()), flush=True)
    print(f"\naccel train, {args.rounds} rounds alternating; median (min-max)")
    print("| contender | overrides | wall s | in-run s | training s | best val_accuracy |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        cells = [spread([row[k] for row in rows])
                 for k in ("wall_s", "run_s", "train_s", "best_val_accuracy")]
        print(f"| {name} | {' '.join(CONTENDERS[name]) or '(default)'} | {' | '.join(cells)} |")
    for key in ("wall_s", "run_s", "train_s"):
        per_round = [n[key] / o[key] for n, o in zip(results["new"], results["old"], strict=True)]
        median = (statistics.median(r[key] for r in results["new"])
                  / statistics.median(r[key] for r in results["old"]))
        print(f"ratio new/old {key}: {median:.2f} (per round {min(per_round):.2f}-"
              f"{max(per_round):.2f})")


if __name__ == "__main__":
    main()
