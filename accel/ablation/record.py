"""What one ablation run measured, read from the per-epoch history `train` returns."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


@dataclass
class RunRecord:
    combination: str
    repeat: int
    seed: int = 0  # train.seed: repeat r of every combination trains with the same one
    run_id: str | None = None
    ok: bool = False
    error: str | None = None
    epochs: int = 0
    first_epoch_s: float = math.nan
    steady_epoch_s: float = math.nan  # median of epochs 2.. (the first epoch when there is one)
    throughput: float = math.nan  # training images/s over the steady epochs
    peak_memory_mb: float = math.nan
    val_accuracy: float = math.nan
    time_to_target_s: float = math.nan  # training seconds until train.target; nan: not reached
    epochs_to_target: float = math.nan
    train_s: float = 0.0  # the epochs' training seconds (evaluation excluded)
    split: dict[str, float] = field(default_factory=dict)  # time_<part>_s and mfu: the median
    # over the steady epochs (accel.timing)


def record_from_history(record: RunRecord, history: list[dict[str, float]],
                        target: dict | None = None,
                        splits: list[dict[str, float]] = ()) -> RunRecord:
    """Epoch 1 (kernel selection, compile) apart; steady state = the median of the later ones.
    With a `target` ({metric, value}), the training time and epochs until it was first reached;
    with the epochs' `splits`, the steady epochs' time split and MFU."""
    from accel.train.epochs import time_to_target

    times = [h["epoch_time_s"] for h in history]
    steady = history[1:] or history  # one epoch: no steady state apart from warm-up
    record.epochs = len(history)
    record.train_s = sum(times)
    record.first_epoch_s = times[0]
    record.steady_epoch_s = statistics.median(h["epoch_time_s"] for h in steady)
    record.throughput = statistics.median(h["train_throughput"] for h in steady)
    record.peak_memory_mb = max(h["peak_memory_mb"] for h in history)
    record.val_accuracy = history[-1]["val_accuracy"]
    steady_splits = splits[1:] or splits
    if steady_splits:
        record.split = {k: statistics.median(s[k] for s in steady_splits)
                        for k in steady_splits[0] if all(k in s for s in steady_splits)}
    hit = time_to_target(target or {}, history)
    if hit is not None:
        record.time_to_target_s, record.epochs_to_target = hit[0], float(hit[1])
    return record
