"""`train(cfg) -> Result`: the one entry the CLI, Optuna, reproduce, ablation and tests call.

`train` reads as the recipe: build what the run needs, open its MLflow run, attach the per-epoch
handlers, run the epochs, finish (test split, artifacts, status). Each step is a function below.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from accel import engine, models, signals
from accel.config import Config
from accel.console import warn
from accel.errors import NonFiniteLoss, one_line
from accel.tracking import retry_locked

__all__ = ["NonFiniteLoss", "Result", "describe", "train"]

METRIC_NAMES = (
    "train_loss",
    "val_loss",
    "val_accuracy",
    "val_f1",
    "epoch_time_s",
    "train_throughput",
    "lr",
    "peak_memory_mb",
)


@dataclass
class Result:
    run_id: str | None
    metrics: dict[str, float]  # the last epoch's metrics (and test_* where a test split exists)
    history: list[dict[str, float]] = field(default_factory=list)  # one dict per epoch
    epochs: int = 0  # epochs completed
    wall_time_s: float = 0.0
    best_epoch: int = 0  # 1-based: the epoch whose weights checkpoint/best.pt holds

    @property
    def best(self) -> dict[str, float]:
        """The best epoch's metrics (by search.metric and direction): an Optuna trial's value
        comes from here, so it and checkpoint/best.pt describe the same weights."""
        return self.history[self.best_epoch - 1] if self.best_epoch else {}


def find_best_epoch(history: list[dict[str, float]], metric: str, direction: str) -> int:
    """1-based index of the best epoch; the earliest one wins a tie (as the checkpoint keeps)."""
    if not history:
        return 0
    sign = 1.0 if direction == "maximize" else -1.0
    best = max(range(len(history)), key=lambda i: (sign * history[i][metric], -i))
    return best + 1


@dataclass
class Parts:
    """Everything one run is made of, built before anything is logged."""

    cfg: Config
    device: torch.device
    data: Any  # accel.data.Data
    bare: torch.nn.Module  # the uncompiled module: its state_dict keys load anywhere
    step: engine.UpdateStep
    trainer: Any  # ignite Engine around `step`
    evaluator: Any  # ignite Engine: accuracy, F1, loss, confusion matrix
    amp_dtype: torch.dtype | None
    epoch_length: int  # micro-batches per epoch
    history: list[dict[str, float]] = field(default_factory=list)


class RunLog:
    """The run's MLflow side; without a tracker (`track=False`) every call does nothing. Writes
    are retried while SQLite says "database is locked" (several processes share a store)."""

    def __init__(self, tracker=None, run_id: str | None = None):
        self.tracker, self.run_id = tracker, run_id

    def metrics(self, values: dict[str, float], step: int) -> None:
        if self.tracker:
            retry_locked(self.tracker.log_metrics, self.run_id, values, step=step)

    def end(self, status: str, error: BaseException | None = None) -> None:
        """End the run with `status`. While `error` propagates, a failure to reach the store
        is only reported: it must not replace the error that ended the run."""
        if not self.tracker:
            return
        try:
            retry_locked(self.tracker.end_run, self.run_id, status)
        except Exception as e:
            if error is None:
                raise
            warn(f"could not mark run {self.run_id} {status}: {one_line(e)}")


def train(
    cfg: Config,
    *,
    trial: Any = None,
    run_name: str | None = None,
    tags: dict[str, str] | None = None,
    parent_run_id: str | None = None,
    track: bool = True,
) -> Result:
    """Train `cfg` once, logging to MLflow; `trial` (Optuna) only adds per-epoch pruning."""
    from accel.tracking import scratch_dir

    started = time.perf_counter()
    parts = build(cfg)
    run = open_run(parts, run_name, tags, parent_run_id) if track else RunLog()
    stopped = _stop_errors(trial)  # a pruned trial, Ctrl-C or SIGTERM: the run ends KILLED
    status, error = "FAILED", None
    with scratch_dir() as checkpoint_dir:
        attach_epoch_handlers(parts, run, Path(checkpoint_dir), trial)
        try:
            final = run_epochs(parts)
            best = find_best_epoch(parts.history, parts.cfg.search.metric,
                                   parts.cfg.search.direction)
            log_results(parts, run, final, best, Path(checkpoint_dir))
            status = "FINISHED"
        except BaseException as e:
            stop = isinstance(e, stopped) or signals.stop_requested()
            status, error = ("KILLED" if stop else "FAILED"), e
            if stop and not isinstance(e, stopped):  # the signal landed inside torch.save, say
                raise KeyboardInterrupt from e
            raise
        finally:
            run.end(status, error)
    return Result(run.run_id, final, parts.history, len(parts.history),
                  time.perf_counter() - started, best)


def _stop_errors(trial: Any) -> tuple[type[BaseException], ...]:
    if trial is None:
        return (KeyboardInterrupt,)
    import optuna

    return (KeyboardInterrupt, optuna.TrialPruned)


# --- build ------------------------------------------------------------------------------------


def build(cfg: Config) -> Parts:
    """Data, model, update step, trainer and evaluator for `cfg` (nothing logged yet)."""
    from accel.data import build_data

    t = cfg.train
    models.check_model_name(cfg.model.name)  # a bad name fails before any data is read
    device = engine.resolve_device(t.device)
    seed_everything(t.seed, t.deterministic)
    data = build_data(cfg, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # this run's peak, not the process's
    bare = models.build_model(cfg, data.num_classes, data.in_chans, data.img_size)
    model = models.prepare_model(bare, cfg, device)

    amp_dtype = engine.resolve_amp(t.amp, device)
    epoch_length = t.epoch_length or len(data.train)
    optimizer = engine.build_optimizer(model, t)
    non_blocking = data.train.pin_memory  # async host-to-device copies need pinned batches
    step = engine.UpdateStep(
        model,
        optimizer,
        torch.nn.CrossEntropyLoss(label_smoothing=t.label_smoothing),
        device,
        accumulation_steps=t.accumulation_steps,
        amp_dtype=amp_dtype,
        scaler=engine.build_scaler(amp_dtype, device),
        clip_grad_norm=t.clip_grad_norm,
        scheduler=engine.build_scheduler(optimizer, t, epoch_length),
        channels_last=t.channels_last,
        non_blocking=non_blocking,
    )
    evaluator = engine.create_evaluator(model, data.num_classes, device, amp_dtype=amp_dtype,
                                        channels_last=t.channels_last, non_blocking=non_blocking)
    return Parts(cfg, device, data, bare, step, engine.create_trainer(step), evaluator,
                 amp_dtype, epoch_length)


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seeds python, numpy and torch; deterministic kernels when asked (slower on GPU)."""
    from ignite.utils import manual_seed

    manual_seed(seed)
    if deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; set before the first CUDA call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = True  # pick the fastest conv kernels for fixed shapes


# --- open the run -----------------------------------------------------------------------------


def open_run(parts: Parts, run_name: str | None, tags: dict[str, str] | None,
             parent_run_id: str | None) -> RunLog:
    """The MLflow run: the whole config and what it resolved to here, and the environment."""
    from accel.tracking import Tracker, environment

    cfg = parts.cfg
    tracker = Tracker(cfg.tracking.uri)
    run_id = retry_locked(
        tracker.start_run,
        cfg.tracking.experiment or cfg.name,
        run_name or f"train-{cfg.model.name}",
        tags={"accel.role": "train", **(tags or {})},
        parent_run_id=parent_run_id,
    )
    run = RunLog(tracker, run_id)
    amp = str(parts.amp_dtype).replace("torch.", "") if parts.amp_dtype else "off"
    try:
        retry_locked(tracker.log_config, run_id, cfg, {
            "effective_batch_size": cfg.train.effective_batch_size,
            "resolved.device": str(parts.device),
            "resolved.amp": amp,
            "resolved.num_classes": parts.data.num_classes,
            "resolved.train_size": len(parts.data.train.dataset),
        })
        env = environment(str(parts.device), cfg.train.seed)
        retry_locked(tracker.log_json, run_id, env, "environment.json")
    except BaseException as e:  # a run that never trained must not stay RUNNING
        run.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED", e)
        raise
    return run


# --- the per-epoch handlers -------------------------------------------------------------------


def attach_epoch_handlers(parts: Parts, run: RunLog, checkpoint_dir: Path, trial: Any) -> None:
    """Per epoch: time the training (evaluation excluded), evaluate, log one point per metric,
    keep the best epoch's weights, and let Optuna prune."""
    from ignite.engine import Events
    from ignite.handlers import Checkpoint, DiskSaver

    trainer, cfg = parts.trainer, parts.cfg
    metric = cfg.search.metric
    sign = 1.0 if cfg.search.direction == "maximize" else -1.0
    checkpoint = Checkpoint(
        {"model": parts.bare},
        DiskSaver(str(checkpoint_dir), require_empty=False),
        filename_prefix="best",
        filename_pattern="{filename_prefix}.{ext}",
        score_function=lambda _: sign * parts.history[-1][metric],
        n_saved=1,
    )
    pruning = None
    if trial is not None:
        from optuna_integration import PyTorchIgnitePruningHandler

        pruning = PyTorchIgnitePruningHandler(trial, metric.removeprefix("val_"), trainer)
    verbose = sys.stderr.isatty()
    if verbose:
        from ignite.handlers import ProgressBar

        ProgressBar(persist=False).attach(trainer,
                                          output_transform=lambda out: {"loss": out["loss"]})
    clock = {"t0": 0.0}

    @trainer.on(Events.EPOCH_STARTED)
    def _start_clock(_) -> None:
        synchronize(parts.device)
        clock["t0"] = time.perf_counter()

    @trainer.on(Events.EPOCH_COMPLETED)
    def _end_epoch(_) -> None:
        if trainer.should_terminate:
            return
        row = epoch_row(parts, clock["t0"])
        parts.history.append(row)
        run.metrics(row, step=trainer.state.epoch)
        if verbose:
            print(f"epoch {trainer.state.epoch}/{cfg.train.epochs} "
                  + " ".join(f"{k}={v:.4g}" for k, v in row.items()), file=sys.stderr)
        checkpoint(parts.evaluator)
        if pruning is not None:
            pruning(parts.evaluator)  # reports this epoch's metric; raises optuna.TrialPruned


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
        "train_throughput": step.stats.samples / seconds,
        "lr": step.optimizer.param_groups[0]["lr"],
        "peak_memory_mb": peak_memory_mb(parts.device),
        "grad_norm": stats["grad_norm"],
    }
    if step.scaler is not None:
        row["skipped_updates"] = stats["skipped_updates"]
    return row


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux -> MiB


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so wall-clock times count it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- run and finish ---------------------------------------------------------------------------


def run_epochs(parts: Parts) -> dict[str, float]:
    """Train all epochs; the last epoch's metrics, plus test_* where a test split exists."""
    t, trainer = parts.cfg.train, parts.trainer
    trainer.run(parts.data.train, max_epochs=t.epochs, epoch_length=parts.epoch_length)
    last_loss = trainer.state.output["loss"] if trainer.state.output else torch.tensor(0.0)
    if not torch.isfinite(last_loss).all():
        raise NonFiniteLoss(
            f"loss became {float(last_loss)} at epoch {trainer.state.epoch} "
            f"(train.lr={t.lr}); the run is marked FAILED"
        )
    final = dict(parts.history[-1])
    if parts.data.test is not None:
        test = parts.evaluator.run(parts.data.test).metrics
        final.update(test_loss=test["loss"], test_accuracy=test["accuracy"],
                     test_f1=float(test["f1"]))
    return final


def log_results(parts: Parts, run: RunLog, final: dict[str, float], best: int,
                checkpoint_dir: Path) -> None:
    """test_* metrics, the best epoch and its metric, the confusion matrix of the last
    evaluation, the best checkpoint."""
    if run.tracker is None:
        return
    metric = parts.cfg.search.metric
    summary = {k: v for k, v in final.items() if k.startswith("test_")}
    summary.update({"best_epoch": best, f"best_{metric}": parts.history[best - 1][metric]})
    run.metrics(summary, step=parts.trainer.state.epoch)
    matrix = parts.evaluator.state.metrics["confusion_matrix"]
    _log_confusion_matrix(run.tracker, run.run_id, matrix, parts.data.classes)
    weights = checkpoint_dir / "best.pt"
    if parts.cfg.tracking.log_checkpoint and weights.exists():
        run.tracker.log_artifact(run.run_id, weights, "checkpoint")


def _log_confusion_matrix(tracker, run_id: str, matrix: torch.Tensor, classes: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay

    side = max(4.0, 0.45 * len(classes))
    fig, ax = plt.subplots(figsize=(side, side))
    ConfusionMatrixDisplay(matrix.cpu().numpy(), display_labels=classes).plot(
        ax=ax, colorbar=False, include_values=len(classes) <= 20, xticks_rotation="vertical"
    )
    fig.tight_layout()
    tracker.log_figure(run_id, fig, "confusion_matrix.png")
    plt.close(fig)


def describe(result: Result) -> str:
    shown = {k: v for k, v in result.metrics.items() if k in METRIC_NAMES or k.startswith("test_")}
    parts = " ".join(f"{k}={v:.4g}" for k, v in shown.items() if math.isfinite(v))
    return f"run {result.run_id}: {result.epochs} epochs in {result.wall_time_s:.1f}s  {parts}"
