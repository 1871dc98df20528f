"""What a run's epochs are made of (accel.train.run orders them): an epoch's row of metrics and
its line, the NaN guard, the best epoch, time to target, Optuna's pruning; and the loop that runs
the epochs, then scores the best epoch's weights."""

from __future__ import annotations

import resource
import sys
import time
from typing import TYPE_CHECKING

import torch

from accel import ranks
from accel.errors import NonFiniteLoss
from accel.timing import split_said

if TYPE_CHECKING:
    import optuna
    from ignite.engine import Engine

    from accel.train.view import RunView


def find_best_epoch(history: list[dict[str, float]], metric: str, direction: str) -> int:
    """1-based index of the best epoch; the earliest one wins a tie."""
    if not history:
        return 0
    sign = 1.0 if direction == "maximize" else -1.0
    best = max(range(len(history)), key=lambda i: (sign * history[i][metric], -i))
    return best + 1


def pruning_handler(trial: optuna.Trial | None, metric: str, trainer: Engine):
    """A trial's pruning handler (None for a lone run, and for a multi-objective study, which
    Optuna does not prune)."""
    if trial is None or len(trial.study.directions) > 1:
        return None
    from optuna_integration import PyTorchIgnitePruningHandler

    return PyTorchIgnitePruningHandler(trial, metric.removeprefix("val_"), trainer)


def progress_bar(trainer: Engine) -> bool:
    """Ignite's bar on a terminal (rank 0); whether there is one. It counts iterations and
    shows no loss: reading the loss of every micro-batch would make the host wait for the
    device each time (the epoch's line says its mean loss)."""
    if not (sys.stderr.isatty() and ranks.rank() == 0):
        return False
    from ignite.handlers import ProgressBar

    ProgressBar(persist=False).attach(trainer)
    return True


def check_finite(row: dict[str, float], epoch: int, lr: float) -> None:
    """The NaN guard, once per epoch: the epoch's mean loss is NaN or inf when any micro-batch's
    was (its sum is kept on the device and read here anyway), and the run ends FAILED."""
    import math

    if not math.isfinite(row["train_loss"]):
        raise NonFiniteLoss(f"loss became {row['train_loss']} in epoch {epoch} "
                            f"(train.lr={lr}); the run is marked FAILED")


def prune(pruning, evaluator) -> None:
    """Reports the epoch's metric to Optuna, which may prune the trial (optuna.TrialPruned);
    rank 0 holds the trial, and its decision ends the other ranks too (Stopped)."""
    pruned = None
    try:
        if pruning is not None:
            pruning(evaluator)
    except Exception as e:  # optuna.TrialPruned, or the storage's error: rank 0 raises it
        pruned = e
    if ranks.rank_zero_decides(pruned is not None):
        raise pruned if pruned is not None else ranks.Stopped("rank 0 ended the run")


def time_to_target(target: dict, history: list[dict[str, float]]) -> tuple[float, int] | None:
    """(training seconds, evaluation excluded, until the first epoch that reaches `target`;
    that epoch), or None. val_loss is reached from above, the other metrics from below."""
    if not target:
        return None
    metric, value = target["metric"], float(target["value"])
    seconds = 0.0
    for epoch, row in enumerate(history, 1):
        seconds += row["epoch_time_s"]
        if (row[metric] <= value) if metric == "val_loss" else (row[metric] >= value):
            return seconds, epoch
    return None


def epoch_row(run: RunView, t0: float) -> dict[str, float]:
    """The epoch's metrics: training loss and speed since `t0`, then validation."""
    step = run.step
    stats = step.stats.summary()  # reads device tensors: a sync point
    synchronize(run.device)
    seconds = time.perf_counter() - t0
    step.clock.trained()
    evaluating = time.perf_counter()
    val = run.evaluator.run(run.data.val).metrics
    step.clock.evaluated(evaluating)
    row = {
        "train_loss": stats["train_loss"],
        "val_loss": val["loss"],
        "val_accuracy": val["accuracy"],
        "val_f1": float(val["f1"]),
        "epoch_time_s": seconds,
        "train_throughput": stats["samples"] / seconds,
        "lr": step.optimizer.param_groups[0]["lr"],
        "peak_memory_mb": peak_memory_mb(run.device),
        "grad_norm": stats["grad_norm"],
    }
    if step.scaler is not None:
        row["skipped_updates"] = stats["skipped_updates"]
    return row


def epoch_line(run: RunView, state, split: dict[str, float]) -> str:
    """`epoch 2/4 ...`, the epoch's metrics, then where its time went and its MFU; a budgeted
    run adds its training clock (the plan's epoch count is revised as the run measures its
    speed)."""
    row = run.history[-1]
    line = f"epoch {state.epoch}/{state.max_epochs} "
    if run.budget is not None:
        trained = sum(r["epoch_time_s"] for r in run.history)
        line += f"({trained:.0f} of {run.cfg.train.budget_s:g} s trained) "
    line += " ".join(f"{k}={v:.4g}" for k, v in row.items())
    return line + " | " + split_line(split)


def split_line(split: dict[str, float]) -> str:
    """`time data 3% copy 0% compute 81% eval 12% record 3% other 1% mfu 0.52`."""
    mfu = f" mfu {split['mfu']:.3g}" if "mfu" in split else ""
    return f"time {split_said(split)}{mfu}"


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux -> MiB


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so wall-clock times count it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- run and finish ---------------------------------------------------------------------------


def run_epochs(run: RunView) -> dict[str, float]:
    """Train all epochs; the last epoch's metrics, plus test_* where a test split exists,
    scored with the best epoch's weights: those best.pt holds, which a registered or served
    model and `accel evaluate` use, so every number of a run describes the model it publishes."""
    t, trainer = run.cfg.train, run.trainer
    epochs = planned_epochs(run)
    if trainer.state.epoch < epochs:  # a run resumed after its last epoch has none left
        trainer.run(run.batches, max_epochs=epochs, epoch_length=run.epoch_length)
    last_loss = trainer.state.output["loss"] if trainer.state.output else torch.tensor(0.0)
    if not torch.isfinite(last_loss).all():
        raise NonFiniteLoss(
            f"loss became {float(last_loss)} at epoch {trainer.state.epoch} "
            f"(train.lr={t.lr}); the run is marked FAILED"
        )
    final = {**run.history[-1], "train_updates": run.step.updates}
    changed = load_best(run)
    scored_anew = run.evaluator.tta != run.cfg.eval.tta  # eval.tta_every_epoch=false
    run.evaluator.tta = run.cfg.eval.tta  # the final scores with the run's TTA
    if run.data.test is None and (changed or scored_anew):  # the confusion matrix logged is
        run.evaluator.run(run.data.val)  # of these weights, scored as the final scores are
    if run.data.test is not None:
        test = run.evaluator.run(run.data.test).metrics
        final.update(test_loss=test["loss"], test_accuracy=test["accuracy"],
                     test_f1=float(test["f1"]))
    return final


def planned_epochs(run: RunView) -> int:
    """train.epochs; with train.budget_s, the epochs of the plan as it stands (a resumed run:
    as its checkpoint left them), which the budget revises as the run goes."""
    trainer, step = run.trainer, run.step
    if run.budget is None:
        return run.cfg.train.epochs
    if trainer.state.epoch and trainer.state.max_epochs:
        return trainer.state.max_epochs
    schedule = run.budget.schedule
    return schedule.epochs_for(schedule.total_at(step.updates))


def load_best(run: RunView) -> bool:
    """Put the best epoch's weights into the model: kept in memory when that epoch ran in this
    process, else (a resumed run whose best epoch came before) read from the run's best.pt.
    False where the model holds them already (or they cannot be found)."""
    cfg = run.cfg
    best = find_best_epoch(run.history, cfg.search.metric, cfg.search.direction)
    if best == len(run.history):
        return False
    state = run.best_state if run.best_state is not None else run.log.stored_best()
    if run.best_state is None:  # several ranks: rank 0 reads the store, the others have none
        state = ranks.from_rank_zero(state)
    if state is None:
        from accel.console import warn

        warn(f"test_* are scored with the last epoch's weights: the best epoch ({best}) ran "
             "before this process and its best.pt is not in the store")
        return False
    run.scored.load_state_dict(state)
    return True
