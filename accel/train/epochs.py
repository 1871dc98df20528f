"""The per-epoch work: time the training, evaluate, log one point per metric, keep the best
epoch's weights and the last epoch's checkpoint, let Optuna prune; and the loop that runs it."""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import torch

from accel import lease, ranks
from accel.console import note
from accel.errors import NonFiniteLoss
from accel.train.parts import Parts
from accel.train.run_log import RunLog


def find_best_epoch(history: list[dict[str, float]], metric: str, direction: str) -> int:
    """1-based index of the best epoch; the earliest one wins a tie."""
    if not history:
        return 0
    sign = 1.0 if direction == "maximize" else -1.0
    best = max(range(len(history)), key=lambda i: (sign * history[i][metric], -i))
    return best + 1


def attach_epoch_handlers(parts: Parts, run: RunLog, trial: Any) -> None:
    """Per epoch: time the training (evaluation excluded), evaluate, log one point per metric,
    keep the best epoch's weights and the last epoch's checkpoint, and let Optuna prune."""
    from ignite.engine import Events

    trainer, cfg = parts.trainer, parts.cfg
    metric, direction = cfg.search.metric, cfg.search.direction
    pruning = _trial_handlers(trainer, trial, metric)
    # One line an epoch with the bar, and for a lone run into a log (a trial says one line)
    verbose = ranks.rank() == 0 and (_progress_bar(trainer) or trial is None)
    clock = {"t0": 0.0}

    @trainer.on(Events.EPOCH_STARTED)
    def _start_clock(_) -> None:
        synchronize(parts.device)
        if parts.device.type == "cuda":  # peak_memory_mb: each epoch's own (and its evaluation)
            torch.cuda.reset_peak_memory_stats(parts.device)
        clock["t0"] = time.perf_counter()

    @trainer.on(Events.EPOCH_COMPLETED)
    def _end_epoch(_) -> None:
        if trainer.should_terminate:
            return
        row = epoch_row(parts, clock["t0"])
        check_finite(row, trainer.state.epoch, cfg.train.lr)
        if trial is not None:  # nothing of the epoch is written for a trial failed meanwhile
            lease.confirm()
        parts.history.append(row)
        while parts.notes:
            note(parts.notes.pop(0))
        if find_best_epoch(parts.history, metric, direction) == len(parts.history):
            weights = parts.scored.state_dict()
            parts.best_state = {k: v.detach().clone() for k, v in weights.items()}
            run.best_weights(parts.scored)
        # The checkpoint (after every draw of randomness this epoch makes) before the epoch's
        # metrics: a run stopped between the two logs them when it resumes, so every epoch is
        # logged exactly once.
        if ranks.world_size() > 1:  # the checkpoint holds every rank's random states
            from accel.train.checkpoint import random_states

            parts.rank_random_states = ranks.gathered(random_states())
        run.last_state(parts)
        if parts.budget is not None:  # the plan so far: what a reproduce replays
            run.budget_plan(parts)
        run.metrics(row, step=trainer.state.epoch)
        if verbose:
            print(epoch_line(parts, trainer.state), file=sys.stderr, flush=True)
        hit = time_to_target(cfg.train.target, parts.history)
        if hit is not None and hit[1] == len(parts.history):  # reached at this very epoch
            run.metrics({"time_to_target_s": hit[0], "epochs_to_target": hit[1]},
                        step=trainer.state.epoch)
            if cfg.train.stop_at_target:
                trainer.terminate()  # the run ends FINISHED after this epoch
                return
        prune(pruning, parts.evaluator)


def _trial_handlers(trainer, trial: Any, metric: str):
    """A trial's: its lease checked at every update (a trial failed meanwhile as stale stops at
    the next one, accel.lease); its pruning handler (None for a multi-objective study, which
    Optuna does not prune), returned."""
    if trial is None:
        return None
    from ignite.engine import Events

    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda _: lease.check())
    if len(trial.study.directions) > 1:
        return None
    from optuna_integration import PyTorchIgnitePruningHandler

    return PyTorchIgnitePruningHandler(trial, metric.removeprefix("val_"), trainer)


def _progress_bar(trainer) -> bool:
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


def epoch_row(parts: Parts, t0: float) -> dict[str, float]:
    """The epoch's metrics: training loss and speed since `t0`, then validation."""
    step = parts.step
    stats = step.stats.summary()  # reads device tensors: a sync point
    synchronize(parts.device)
    seconds = time.perf_counter() - t0
    val = parts.evaluator.run(parts.data.val).metrics
    row = {
        "train_loss": stats["train_loss"],
        "val_loss": val["loss"],
        "val_accuracy": val["accuracy"],
        "val_f1": float(val["f1"]),
        "epoch_time_s": seconds,
        "train_throughput": stats["samples"] / seconds,
        "lr": step.optimizer.param_groups[0]["lr"],
        "peak_memory_mb": peak_memory_mb(parts.device),
        "grad_norm": stats["grad_norm"],
    }
    if step.scaler is not None:
        row["skipped_updates"] = stats["skipped_updates"]
    return row


def epoch_line(parts: Parts, state) -> str:
    """`epoch 2/4 ...` and the epoch's metrics; a budgeted run adds its training clock (the
    plan's epoch count is revised as the run measures its speed)."""
    row = parts.history[-1]
    line = f"epoch {state.epoch}/{state.max_epochs} "
    if parts.budget is not None:
        trained = sum(r["epoch_time_s"] for r in parts.history)
        line += f"({trained:.0f} of {parts.cfg.train.budget_s:g} s trained) "
    return line + " ".join(f"{k}={v:.4g}" for k, v in row.items())


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux -> MiB


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so wall-clock times count it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- run and finish ---------------------------------------------------------------------------


def run_epochs(parts: Parts, run: RunLog) -> dict[str, float]:
    """Train all epochs; the last epoch's metrics, plus test_* where a test split exists,
    scored with the best epoch's weights: those best.pt holds, which a registered or served
    model and `accel evaluate` use, so every number of a run describes the model it publishes."""
    t, trainer = parts.cfg.train, parts.trainer
    epochs = planned_epochs(parts)
    if trainer.state.epoch < epochs:  # a run resumed after its last epoch has none left
        trainer.run(parts.batches, max_epochs=epochs, epoch_length=parts.epoch_length)
    last_loss = trainer.state.output["loss"] if trainer.state.output else torch.tensor(0.0)
    if not torch.isfinite(last_loss).all():
        raise NonFiniteLoss(
            f"loss became {float(last_loss)} at epoch {trainer.state.epoch} "
            f"(train.lr={t.lr}); the run is marked FAILED"
        )
    final = {**parts.history[-1], "train_updates": parts.step.updates}
    changed = load_best(parts, run)
    if parts.data.test is None and changed:  # the confusion matrix logged is of these weights
        parts.evaluator.run(parts.data.val)
    if parts.data.test is not None:
        test = parts.evaluator.run(parts.data.test).metrics
        final.update(test_loss=test["loss"], test_accuracy=test["accuracy"],
                     test_f1=float(test["f1"]))
    return final


def planned_epochs(parts: Parts) -> int:
    """train.epochs; with train.budget_s, the epochs of the plan as it stands (a resumed run:
    as its checkpoint left them), which the budget revises as the run goes."""
    trainer, step = parts.trainer, parts.step
    if parts.budget is None:
        return parts.cfg.train.epochs
    if trainer.state.epoch and trainer.state.max_epochs:
        return trainer.state.max_epochs
    schedule = parts.budget.schedule
    return schedule.epochs_for(schedule.total_at(step.updates))


def load_best(parts: Parts, run: RunLog) -> bool:
    """Put the best epoch's weights into the model: kept in memory when that epoch ran in this
    process, else (a resumed run whose best epoch came before) read from the run's best.pt.
    False where the model holds them already (or they cannot be found)."""
    cfg = parts.cfg
    best = find_best_epoch(parts.history, cfg.search.metric, cfg.search.direction)
    if best == len(parts.history):
        return False
    state = parts.best_state if parts.best_state is not None else run.stored_best()
    if parts.best_state is None:  # several ranks: rank 0 reads the store, the others have none
        state = ranks.from_rank_zero(state)
    if state is None:
        from accel.console import warn

        warn(f"test_* are scored with the last epoch's weights: the best epoch ({best}) ran "
             "before this process and its best.pt is not in the store")
        return False
    parts.scored.load_state_dict(state)
    return True
