"""MLflow tracking overhead: the same `train(cfg)` with and without tracking, side by side.

Both contenders run the whole `train` (data, model, epochs, validation, test); the tracked one
also creates the run, logs the ~60 params, config.yaml, environment.json, per-epoch metrics, the
confusion matrix and the checkpoints (best.pt when an epoch is the best so far, the last-epoch
checkpoint for `accel resume` after every epoch) into a local SQLite store (created once, before
timing, as a user's store already exists). A third contender tracks without checkpoints
(`tracking.log_checkpoint=false`), to show what they cost. Rounds alternate so machine drift hits
all alike. Prints the ratio last (goal <= 1.02).

    .venv/bin/python bench/tracking_overhead.py [CONFIG] [KEY=VALUE ...] [--rounds 3]

CONFIG defaults to experiments/quickstart.yaml (about 20 s per run on a quiet 2-core CPU).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import print_ratio, summary, time_rounds  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("items", nargs="*", metavar="[CONFIG] [KEY=VALUE]")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from accel import config
    from accel.console import quiet_libraries
    from accel.train import train
    from accel.uris import redact

    items = args.items
    path = items.pop(0) if items and "=" not in items[0] else ROOT / "experiments/quickstart.yaml"
    cfg = config.load(path, items)
    quiet_libraries()
    store = tempfile.mkdtemp(prefix="accel-bench-")
    cfg.tracking.uri = f"sqlite:///{store}/mlflow.db"
    cfg.tracking.experiment = "bench-tracking"

    print(
        f"{path}: model {cfg.model.name}, data {cfg.data.dataset}, {cfg.train.epochs} epochs; "
        f"store {redact(str(cfg.tracking.uri))}"
    )
    import dataclasses

    bare = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking,
                                                                 log_checkpoint=False))
    contenders = {"tracked": lambda: train(cfg), "untracked": lambda: train(cfg, track=False),
                  "no-ckpt": lambda: train(bare)}
    times = time_rounds(contenders, args.rounds)
    for name, ts in times.items():
        print(f"{name:10s} {summary(ts)}")
    seconds = sorted(a - b for a, b in zip(times["tracked"], times["untracked"], strict=True))
    print(
        f"tracking cost per run: {seconds[len(seconds) // 2]:.2f} s (median of the paired "
        f"differences; fixed per run, so its share falls as runs get longer)"
    )
    print_ratio(times, "tracked", "no-ckpt",
                "checkpoint cost ratio (tracked / tracked without checkpoints)", ".3f")
    print_ratio(
        times, "tracked", "untracked", "tracking overhead ratio (tracked / untracked)", ".3f"
    )


if __name__ == "__main__":
    main()
