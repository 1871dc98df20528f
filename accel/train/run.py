"""One run and its order of events, in one place.

`Run` holds what a run is made of (built by `accel.train.parts.build`) and owns everything
that happens around Ignite's loop: `attach` registers its handlers, and its methods list every
step in the order it is taken. docs/architecture.md#a-runs-order shows the same list, read from
these methods by tests/test_architecture_order.py.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from accel import lease, ranks
from accel.averaging import Lookahead, MovingAverage
from accel.console import note
from accel.engine import EpochStats, HeldParameter, UpdateStep
from accel.timing import split_row
from accel.train import epochs
from accel.train.budget import Budget
from accel.train.loader import Batches
from accel.train.peak import ENV, peak
from accel.train.run_log import RunLog

if TYPE_CHECKING:
    import optuna
    from ignite.engine import Engine

    from accel.config import Config
    from accel.data import Data
    from accel.flops import Count
    from accel.train.amp_probe import AmpDecision
    from accel.train.peak import Peak


@dataclass
class Run:
    """What one run is made of, and what it does after each update and at each epoch's start
    and end."""

    cfg: Config
    device: torch.device
    data: Data
    bare: torch.nn.Module  # the uncompiled module: its state_dict keys load anywhere
    step: UpdateStep
    trainer: Engine  # Ignite's engine around `step`
    evaluator: Engine  # accuracy, F1, loss, confusion matrix
    amp: AmpDecision  # what train.amp resolved to, and how
    epoch_length: int  # micro-batches per epoch
    batches: Batches  # the train loader, as the trainer reads it
    budget: Budget | None = None  # train.budget_s
    held: HeldParameter | None = None  # train.whiten_bias_epochs: the whitening bias
    averaged: MovingAverage | None = None  # train.ema_decay: the average of `bare`
    lookahead: Lookahead | None = None  # train.lookahead_decay: written back into `bare`
    history: list[dict[str, float]] = field(default_factory=list)  # one row per epoch
    best_state: dict[str, torch.Tensor] | None = None  # the best epoch's weights, this process
    rank_random_states: list[dict] | None = None  # every rank's, at the last epoch's end
    notes: list[str] = field(default_factory=list)  # said once an epoch has trained: bad data
    # found in the first epoch is then the only line a failed command prints
    log: RunLog = field(default_factory=RunLog)  # the MLflow run; untracked until opened
    trial: optuna.Trial | None = None
    pruning: Callable[[Engine], None] | None = None  # Optuna's pruning handler
    verbose: bool = False  # one line per epoch on stderr
    epoch_started_at: float = 0.0  # perf_counter at this epoch's start: the one clock
    flops: Count | None = None  # FLOPs of one training image (rank 0; None if not counted)
    peak: Peak | None = None  # the machine's peak FLOP rate in the run's precision (rank 0)
    splits: list[dict[str, float]] = field(default_factory=list)  # time split + MFU per epoch

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return self.amp.dtype

    @property
    def scored(self) -> torch.nn.Module:
        """The weights that are evaluated, kept as the best and logged: the moving average of
        `bare` with train.ema_decay, else `bare` itself (with train.lookahead_decay it holds
        the Lookahead's average)."""
        return self.averaged.module if self.averaged is not None else self.bare

    def attach(self, trial: optuna.Trial | None = None) -> None:
        """Every handler of the run, registered here and nowhere else (Ignite's metrics and
        progress bar aside): what follows an update, an epoch's start and its end, and a
        trial's lease check after every iteration."""
        from ignite.engine import Events

        self.trial = trial
        self.step.after_update = self.after_update
        self.trainer.add_event_handler(Events.EPOCH_STARTED, self.start_epoch)
        if trial is not None:  # a trial failed meanwhile as stale stops at the next update
            self.trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda _: lease.check())
        self.trainer.add_event_handler(Events.EPOCH_COMPLETED, self.end_epoch)
        self.pruning = epochs.pruning_handler(trial, self.cfg.search.metric, self.trainer)
        # one line an epoch with the bar, and for a lone run into a log (a trial says one line)
        self.verbose = ranks.rank() == 0 and (epochs.progress_bar(self.trainer) or trial is None)

    # --- the order ----------------------------------------------------------------------------

    def after_update(self, skipped: torch.Tensor | None) -> None:
        """After every optimizer update (`skipped`: fp16's inf check, on the device)."""
        self.keep_to_budget()  # may end the plan, and the epoch, at this update
        self.hold_bias()  # the whitening bias, once held, put back after every update
        self.average(skipped)  # the moving average sees the weights the next update starts from
        self.look_ahead()  # the Lookahead's average, written back into the weights

    def start_epoch(self, _: Engine) -> None:
        """At every epoch's start."""
        self.reset_stats()
        self.hold_bias_for_epoch()
        self.start_clock()

    def end_epoch(self, _: Engine) -> None:
        """At every epoch's end (not one a stop ended)."""
        if self.trainer.should_terminate:
            return
        row = self.score_epoch()  # stats read, clock read, then the evaluation
        self.check_finite(row)  # the NaN guard: the run ends FAILED here
        self.confirm_lease()  # nothing of the epoch is written for a trial failed meanwhile
        self.history.append(row)
        self.say_notes()
        self.keep_best()
        self.checkpoint()  # before the metrics: a run stopped between them logs them on resume
        split = self.time_epoch(row)  # the clock stops before the metrics' own call
        self.confirm_lease()  # again: a worker frozen after the first (uploads, checkpoint,
        # a peak probed again) has its trial failed meanwhile and logs no metric of it
        self.log_epoch(row, split)
        if self.reach_target():
            return
        self.prune()

    # --- after an update ----------------------------------------------------------------------

    def keep_to_budget(self) -> None:
        """train.budget_s: the budget reads the clock and may revise the plan, end it at this
        update (the epoch ends here too, and is evaluated) or lengthen it."""
        if self.budget is None:
            return
        state = self.trainer.state
        plan = self.budget.after_update(self.step.updates, state.epoch, self.trained_s)
        if plan is not None:
            state.max_epochs, ends_now = plan
            if ends_now:
                self.trainer.terminate_epoch()

    def hold_bias(self) -> None:
        if self.held is not None:
            self.held.hold_when_due(self.step.updates)
            self.held.put_back()

    def average(self, skipped: torch.Tensor | None) -> None:
        if self.averaged is not None:
            self.averaged.update_parameters(self.bare, skipped)

    def look_ahead(self) -> None:
        """train.lookahead_decay: every few updates the average moves toward the weights and is
        written into them. A whitening bias held by then holds what it was given: airbench's
        frozen bias takes the average too, and stays there until the next write-back."""
        if self.lookahead is None or not self.lookahead.after_update(self.step.updates):
            return
        if self.held is not None and self.held.value is not None:
            self.held.hold()

    # --- at an epoch's start ------------------------------------------------------------------

    def reset_stats(self) -> None:
        self.step.stats = EpochStats()

    def hold_bias_for_epoch(self) -> None:
        if self.held is not None:
            self.held.hold_for_epoch(self.trainer.state.epoch, self.step.updates)

    def start_clock(self) -> None:
        """The epoch's clock (CUDA: after the queued work, with the epoch's own memory peak);
        the budget starts its epoch from the same reading."""
        epochs.synchronize(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.epoch_started_at = time.perf_counter()
        self.step.clock.start()
        if self.budget is not None:
            self.budget.start_epoch(self.step.updates, self.trained_s())

    def trained_s(self) -> float:
        """Training seconds so far: the epochs done (their evaluation excluded), then this one."""
        done = sum(row["epoch_time_s"] for row in self.history)
        return done + time.perf_counter() - self.epoch_started_at

    # --- at an epoch's end --------------------------------------------------------------------

    def score_epoch(self) -> dict[str, float]:
        return epochs.epoch_row(self, self.epoch_started_at)

    def check_finite(self, row: dict[str, float]) -> None:
        epochs.check_finite(row, self.trainer.state.epoch, self.cfg.train.lr)

    def confirm_lease(self) -> None:
        if self.trial is not None:
            lease.confirm()

    def say_notes(self) -> None:
        while self.notes:
            note(self.notes.pop(0))

    def keep_best(self) -> None:
        """The best epoch so far: its weights kept in memory and logged as best.pt."""
        search = self.cfg.search
        best = epochs.find_best_epoch(self.history, search.metric, search.direction)
        if best == len(self.history):
            weights = self.scored.state_dict()
            self.best_state = {k: v.detach().clone() for k, v in weights.items()}
            self.log.best_weights(self.scored)

    def checkpoint(self) -> None:
        """The last epoch's checkpoint (after every draw of randomness this epoch makes), and
        a budgeted run's plan so far (what a reproduce replays)."""
        if ranks.world_size() > 1:  # the checkpoint holds every rank's random states
            from accel.train.random_state import random_states

            self.rank_random_states = ranks.gathered(random_states())
        self.log.last_state(self)
        if self.budget is not None:
            self.log.budget_plan(self)

    def time_epoch(self, row: dict[str, float]) -> dict[str, float]:
        """Where the epoch's time went (data, copy, compute, evaluation, record, other) and
        its FLOP rate against the machine's peak (accel.timing, accel.train.peak)."""
        now, clock = time.perf_counter(), self.step.clock
        split = split_row(clock.training, clock.eval_s, now - clock.evaluated_at,
                          now - self.epoch_started_at)
        if self.flops is not None and self.peak is not None:
            split.update(speed(self.flops.per_image, row["train_throughput"], self.peak))
            if split["mfu"] > 1 and self.peak.how != ENV:  # the probe read low: probed on a
                # busy machine, or its shapes ran slower than the model's batches do
                achieved = split["achieved_tflops"] / ranks.world_size()
                again = self.peak.how != "achieved"  # probed low here already: no third time
                self.peak = peak(self.device, self.amp_dtype, self.flops.heaviest_conv,
                                 self.cfg.train.channels_last, again=again, at_least=achieved)
                self.log.peak(self)
                split.update(speed(self.flops.per_image, row["train_throughput"], self.peak))
        self.splits.append(split)
        return split

    def log_epoch(self, row: dict[str, float], split: dict[str, float]) -> None:
        self.log.metrics({**row, **split}, step=self.trainer.state.epoch)
        if self.verbose:
            print(epochs.epoch_line(self, self.trainer.state, split), file=sys.stderr,
                  flush=True)

    def reach_target(self) -> bool:
        """train.target reached at this very epoch: logged; with train.stop_at_target the run
        ends FINISHED after it (True)."""
        hit = epochs.time_to_target(self.cfg.train.target, self.history)
        if hit is None or hit[1] != len(self.history):
            return False
        self.log.metrics({"time_to_target_s": hit[0], "epochs_to_target": hit[1]},
                         step=self.trainer.state.epoch)
        if self.cfg.train.stop_at_target:
            self.trainer.terminate()
            return True
        return False

    def prune(self) -> None:
        epochs.prune(self.pruning, self.evaluator)


def speed(flops_per_image: float, throughput: float, peak: Peak) -> dict[str, float]:
    """The epoch's achieved TFLOPS (its training images a second x FLOPs of one, over its
    training time: data, copy and compute) and MFU, against the peak of every rank's device."""
    achieved = flops_per_image * throughput / 1e12
    return {"achieved_tflops": achieved, "mfu": achieved / (peak.tflops * ranks.world_size())}
