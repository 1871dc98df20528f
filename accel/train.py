"""`train(cfg) -> Result`: the one entry the CLI, Optuna, reproduce, ablation and tests call."""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from accel.config import Config

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


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or inf; the run ends FAILED."""


@dataclass
class Result:
    run_id: str | None
    metrics: dict[str, float]  # the last epoch's metrics (and test_* where a test split exists)
    history: list[dict[str, float]] = field(default_factory=list)  # one dict per epoch
    epochs: int = 0  # epochs completed
    wall_time_s: float = 0.0


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


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux -> MiB


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so wall-clock times count it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    from ignite.engine import Events
    from ignite.handlers import Checkpoint, DiskSaver

    from accel import engine as E
    from accel.data import build_data
    from accel.models import build_model, check_model_name, prepare_model
    from accel.tracking import Tracker, environment, scratch_dir, write_json

    t, started = cfg.train, time.perf_counter()
    check_model_name(cfg.model.name)  # a bad name fails before any data is read
    device = E.resolve_device(t.device)
    seed_everything(t.seed, t.deterministic)
    data = build_data(cfg, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # this run's peak, not the process's
    bare = build_model(cfg, data.num_classes, data.in_chans, data.img_size)
    model = prepare_model(bare, cfg, device)

    amp_dtype = E.resolve_amp(t.amp, device)
    epoch_length = t.epoch_length or len(data.train)
    optimizer = E.build_optimizer(model, t)
    non_blocking = data.train.pin_memory  # async host-to-device copies need pinned batches
    step = E.UpdateStep(
        model,
        optimizer,
        torch.nn.CrossEntropyLoss(label_smoothing=t.label_smoothing),
        device,
        accumulation_steps=t.accumulation_steps,
        amp_dtype=amp_dtype,
        scaler=E.build_scaler(amp_dtype, device),
        clip_grad_norm=t.clip_grad_norm,
        scheduler=E.build_scheduler(optimizer, t, epoch_length),
        channels_last=t.channels_last,
        non_blocking=non_blocking,
    )
    trainer = E.create_trainer(step)
    evaluator = E.create_evaluator(
        model,
        data.num_classes,
        device,
        amp_dtype=amp_dtype,
        channels_last=t.channels_last,
        non_blocking=non_blocking,
    )

    tracker = Tracker(cfg.tracking.uri) if track else None
    run_id = None
    if tracker:
        run_id = tracker.start_run(
            cfg.tracking.experiment or cfg.name,
            run_name or f"train-{cfg.model.name}",
            tags={"accel.role": "train", **(tags or {})},
            parent_run_id=parent_run_id,
        )
        # The logged config is the run's recipe; where it was stored is not part of it (and a
        # store URL may hold a password), so tracking.uri is logged as null.
        logged = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, uri=None))
        tracker.log_params(
            run_id,
            {
                **logged.flat(),
                "effective_batch_size": t.effective_batch_size,
                "resolved.device": str(device),
                "resolved.amp": str(amp_dtype).replace("torch.", "") if amp_dtype else "off",
                "resolved.num_classes": data.num_classes,
                "resolved.train_size": len(data.train.dataset),
            },
        )
        tracker.log_text(run_id, logged.to_yaml(), "config.yaml")
        with scratch_dir() as tmp:
            env = environment(str(device), t.seed)
            tracker.log_artifact(run_id, write_json(env, tmp, "environment.json"))

    history: list[dict[str, float]] = []
    metric = cfg.search.metric
    sign = 1.0 if cfg.search.direction == "maximize" else -1.0
    tmp_ckpt = scratch_dir()
    checkpoint = Checkpoint(
        {"model": bare},  # the uncompiled module: its state_dict keys load anywhere
        DiskSaver(tmp_ckpt.name, require_empty=False),
        filename_prefix="best",
        filename_pattern="{filename_prefix}.{ext}",
        score_function=lambda _: sign * history[-1][metric],
        n_saved=1,
    )
    pruning = None
    if trial is not None:
        from optuna_integration import PyTorchIgnitePruningHandler

        pruning = PyTorchIgnitePruningHandler(trial, metric.removeprefix("val_"), trainer)

    clock = {"t0": 0.0}
    progress = sys.stderr.isatty()
    if progress:
        from ignite.handlers import ProgressBar

        ProgressBar(persist=False).attach(
            trainer, output_transform=lambda out: {"loss": out["loss"]}
        )

    @trainer.on(Events.EPOCH_STARTED)
    def _start_clock(engine) -> None:
        synchronize(device)
        clock["t0"] = time.perf_counter()

    @trainer.on(Events.EPOCH_COMPLETED)
    def _end_epoch(engine) -> None:
        if engine.should_terminate:
            return
        stats = step.stats.summary()  # reads device tensors: a sync point
        synchronize(device)
        seconds = time.perf_counter() - clock["t0"]
        val = evaluator.run(data.val).metrics
        row = {
            "train_loss": stats["train_loss"],
            "val_loss": val["loss"],
            "val_accuracy": val["accuracy"],
            "val_f1": float(val["f1"]),
            "epoch_time_s": seconds,
            "train_throughput": step.stats.samples / seconds,
            "lr": optimizer.param_groups[0]["lr"],
            "peak_memory_mb": peak_memory_mb(device),
            "grad_norm": stats["grad_norm"],
        }
        if step.scaler is not None:
            row["skipped_updates"] = stats["skipped_updates"]
        history.append(row)
        if tracker:
            tracker.log_metrics(run_id, row, step=engine.state.epoch)
        if progress:
            print(
                f"epoch {engine.state.epoch}/{t.epochs} "
                + " ".join(f"{k}={v:.4g}" for k, v in row.items()),
                file=sys.stderr,
            )
        checkpoint(evaluator)
        if pruning is not None:
            pruning(evaluator)  # reports this epoch's metric; raises optuna.TrialPruned

    status = "FAILED"
    try:
        trainer.run(data.train, max_epochs=t.epochs, epoch_length=epoch_length)
        last_loss = trainer.state.output["loss"] if trainer.state.output else torch.tensor(0.0)
        if not torch.isfinite(last_loss).all():
            raise NonFiniteLoss(
                f"loss became {float(last_loss)} at epoch {trainer.state.epoch} "
                f"(train.lr={t.lr}); the run is marked FAILED"
            )
        final = dict(history[-1])
        if data.test is not None:
            test = evaluator.run(data.test).metrics
            final.update(
                test_loss=test["loss"], test_accuracy=test["accuracy"], test_f1=float(test["f1"])
            )
        if tracker:
            if data.test is not None:
                tracker.log_metrics(
                    run_id,
                    {k: v for k, v in final.items() if k.startswith("test_")},
                    step=trainer.state.epoch,
                )
            _log_confusion_matrix(
                tracker, run_id, evaluator.state.metrics["confusion_matrix"], data.classes
            )
            best = Path(tmp_ckpt.name) / "best.pt"
            if cfg.tracking.log_checkpoint and best.exists():
                tracker.log_artifact(run_id, best, "checkpoint")
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as e:
        if type(e).__name__ == "TrialPruned":
            status = "KILLED"
        raise
    finally:
        tmp_ckpt.cleanup()
        if tracker:
            tracker.end_run(run_id, status)
    return Result(run_id, final, history, len(history), time.perf_counter() - started)


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
