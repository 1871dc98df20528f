"""`train(cfg) -> Result`: the one entry the CLI, Optuna, reproduce, ablation and tests call.

`train` reads as the recipe: build the run (`parts` makes a `run.Run`), restore a checkpoint
when it resumes (`checkpoint`), open its MLflow run (`run_log`), attach the run's handlers (its
order of events: `run`) and run the epochs (`epochs`), finish (test split, artifacts, status).
"""

from __future__ import annotations

import math
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel import lease, signals
from accel.config import Config
from accel.console import program
from accel.errors import NonFiniteLoss
from accel.ranks import rank
from accel.tracking import scratch_dir
from accel.train.checkpoint import Resume, restore
from accel.train.epochs import find_best_epoch, run_epochs
from accel.train.launch import ranks
from accel.train.memory import start_fresh
from accel.train.parts import Replay, build
from accel.train.run import Run
from accel.train.run_log import log_results, open_run, run_costs
from accel.uris import redact

__all__ = ["NonFiniteLoss", "Replay", "Result", "Resume", "find_best_epoch", "result_line",
           "train"]

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
    metric: str = "val_accuracy"  # search.metric: what picked the best epoch
    splits: list[dict[str, float]] = field(default_factory=list)  # time split + MFU per epoch
    # this process trained (accel.timing)

    @property
    def best(self) -> dict[str, float]:
        """The best epoch's metrics (by search.metric and direction): an Optuna trial's value
        comes from here, so it and checkpoint/best.pt describe the same weights."""
        return self.history[self.best_epoch - 1] if self.best_epoch else {}

    @property
    def costs(self) -> dict[str, float]:
        """What the run cost (config.COST_METRICS): total training seconds (evaluation
        excluded), mean images per second, peak memory."""
        return run_costs(self.history)


def train(
    cfg: Config,
    *,
    trial: Any = None,
    run_name: str | None = None,
    tags: dict[str, str] | None = None,
    parent_run_id: str | None = None,
    track: bool = True,
    resume: Resume | None = None,
    replay: Replay | None = None,
) -> Result:
    """Train `cfg` once, logging to MLflow; `trial` (Optuna) only adds per-epoch pruning;
    `resume` carries on from a last-epoch checkpoint (accel.train.checkpoint); `replay` makes
    the decisions a logged run made on its machine again (accel.train.parts.Replay). With
    `train.nproc_per_node` > 1 this process is rank 0 of the run (accel.train.launch)."""
    with ranks(cfg, resume):
        if rank() != 0:  # under torchrun, rank 0 alone logs and reports
            track, trial = False, None
        return _train(cfg, trial, run_name, tags, parent_run_id, track, resume, replay)


def _train(cfg: Config, trial: Any, run_name: str | None, tags: dict[str, str] | None,
           parent_run_id: str | None, track: bool, resume: Resume | None,
           replay: Replay | None = None) -> Result:
    started = time.perf_counter()
    start_fresh(cfg.train.device)
    run = build(cfg, replay)
    if resume is not None:
        restore(run, resume.state)
        _report_earlier_epochs(trial, run)
    stopped = _stop_errors(trial)  # a pruned trial, Ctrl-C or SIGTERM ends the run KILLED
    status, error = "FAILED", None
    with scratch_dir() as scratch:
        try:
            if track:
                if trial is not None:  # a trial failed meanwhile must not make its run
                    lease.confirm()
                with signals.atomic():  # the run is made whole; a stop meanwhile ends it KILLED
                    run.log = open_run(run, run_name, tags, parent_run_id, Path(scratch), resume)
            run.attach(trial)
            final = run_epochs(run)
            if trial is not None:  # a trial failed meanwhile must not write its outcome
                lease.confirm()
            best = find_best_epoch(run.history, cfg.search.metric, cfg.search.direction)
            log_results(run, final, best)
            status = "FINISHED"
            run.log.drop_last_state()
        except lease.LeaseLost:
            status = None  # left alone: the storage and the trial's retry keep its record
            raise
        except BaseException as e:
            stop = isinstance(e, stopped) or signals.stop_requested()
            status, error = ("KILLED" if stop else "FAILED"), e
            log = run.log
            if isinstance(e, stopped) and not isinstance(e, KeyboardInterrupt):
                log.drop_last_state()  # a pruned trial keeps no checkpoint: nothing resumes it
            elif stop and log.run_id and trial is None:  # the command's last line says how to
                # carry the run on (a study says it for its trials)
                signals.leave_behind(stopped_run_line(log.run_id, cfg, parent_run_id,
                                                      log.resumable or resume is not None))
            if stop and not isinstance(e, stopped):  # it came as another error (torch.save's)
                raise KeyboardInterrupt from e
            raise
        finally:
            run.log.end(status, error)
            run.data.close()  # a study or an ablation trains again in this process
    return Result(run.log.run_id, final, run.history, len(run.history),
                  time.perf_counter() - started, best, cfg.search.metric, run.splits)


def stopped_run_line(run_id: str, cfg: Config, parent_run_id: str | None,
                     resumable: bool) -> str:
    """What a stopped run's command says last: the run, and how to carry it on."""
    if parent_run_id is not None:  # an ablation's or a verification's run: its command again
        return f"run {run_id} was marked KILLED"
    if not cfg.tracking.log_checkpoint:
        return (f"run {run_id} was marked KILLED (tracking.log_checkpoint=false: no checkpoint "
                "to resume): run the same command again to start over")
    if not resumable:
        return (f"run {run_id} was marked KILLED before its first checkpoint: run the same "
                "command again to start over")
    where = f" --tracking-uri {shlex.quote(redact(cfg.tracking.uri))}" if cfg.tracking.uri else ""
    return f"run {run_id} was marked KILLED; carry it on with: {program()} resume {run_id}{where}"


def _stop_errors(trial: Any) -> tuple[type[BaseException], ...]:
    if trial is None:
        return (KeyboardInterrupt,)
    import optuna

    return (KeyboardInterrupt, optuna.TrialPruned)


def _report_earlier_epochs(trial: Any, run: Run) -> None:
    """A retried trial tells Optuna the epochs its predecessor ran (pruners compare curves).
    Optuna takes no intermediate values from a multi-objective trial (nor prunes one)."""
    if trial is not None and len(trial.study.directions) == 1:
        for epoch, row in enumerate(run.history, start=1):
            trial.report(row[run.cfg.search.metric], epoch)


def result_line(result: Result) -> str:
    """The line `accel train` and `accel resume` print for a finished run: its epochs, where the
    time went, its last and best metrics."""
    shown = {k: v for k, v in result.metrics.items() if k in METRIC_NAMES or k.startswith("test_")}
    if result.best_epoch:  # shows best.pt's epoch, which test_* and a registered model use
        shown = {**shown, "best_epoch": result.best_epoch,
                 f"best_{result.metric}": result.best[result.metric]}
    parts = " ".join(f"{k}={v:.4g}" for k, v in shown.items() if math.isfinite(v))
    trained = sum(row["epoch_time_s"] for row in result.history)
    outside = max(0.0, result.wall_time_s - trained)
    return (f"run {result.run_id}: {result.epochs} epochs in {result.wall_time_s:.1f}s "
            f"({trained:.1f} s training, {outside:.1f} s outside it: set-up, evaluation, test "
            f"split, logging)  {parts}")
