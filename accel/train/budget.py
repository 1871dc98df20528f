"""`train.budget_s`: the schedule laid over a wall-clock training budget (Li, Yumer and Ramanan,
"Budgeted Training", ICLR 2020: a schedule that ends at the budget beats one cut short by it).

The run starts on the nominal plan (`train.epochs` of updates). After a few updates it knows its
own speed (seconds per update, the first updates of a process left out: they build kernels) and
revises the plan to the updates that fit the budget; it revises again at each epoch's end, and at
every update of the epoch the plan ends in, so the last update is the one after which another
would not fit (or the end of the epoch before, where the last would hold only a few updates).
The learning rate's decay, the warm-up and the whitening bias's hold follow the plan
(accel.schedule.Schedule); the moving average and the per-epoch evaluations (Optuna's
pruning reports) come with every update and epoch as before. Only training counts: the
evaluations after each epoch and the test split after the last are outside the budget.

Every revision is kept, so `accel reproduce` replays the plan update by update (`replay`: the
clock is not read) and `accel resume` carries it on from the checkpoint's scheduler state.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from accel.schedule import Schedule

ARTIFACT = "budget_plan.json"
UNMEASURED_UPDATES = 2  # a process's first updates: oneDNN and the allocator warm up
MEASURED_UPDATES = 3  # updates timed before the first estimate
# A plan that would start an epoch only to make this share of its updates ends at the epoch
# before instead: the few updates given up are worth less than the evaluation they would cost.
TAIL_SHARE = 0.02
# CUDA: the host queues updates ahead of the device, so the clock means something only after a
# sync. The budget syncs and reads it every SYNC_EVERY updates (one wait per 8 updates, not one
# per update), and at every update once the budget's end is that near.
SYNC_EVERY = 8


class Budget:
    """Reads the training clock after every update (CUDA: every SYNC_EVERY, after a sync) and
    keeps the plan within the budget. A plain object: the run tells it the update count and
    lends it the run's training clock; it answers with what the plan now is."""

    def __init__(self, schedule: Schedule, device: torch.device | None = None):
        self.schedule = schedule
        self.mark: tuple[int, float] | None = None  # (updates, training s) where timing began
        self.first: int | None = None  # the update count this process started from
        self.started = 0.0  # training seconds when this process started
        self.estimated = False  # this process made its first estimate
        self.update_s: float | None = None  # seconds per update, as measured here
        self.last_update_s: float | None = None  # the latest update's own seconds
        self._before = 0.0  # training seconds when the clock was last read
        self._looked = 0  # the update count then
        # CUDA: waits for the device before the clock is read
        self.sync = (functools.partial(torch.cuda.synchronize, device)
                     if device is not None and device.type == "cuda" else None)

    def start_epoch(self, updates: int, trained_s: float) -> None:
        """At an epoch's start: `updates` so far, `trained_s` training seconds so far."""
        self._before, self._looked = trained_s, updates

    def _look_now(self, u: int, trained_s: Callable[[], float]) -> bool:
        """CUDA: whether to sync and read the clock after update `u`: every SYNC_EVERY
        updates, while the speed is first measured, and at every update near the end."""
        if u % SYNC_EVERY == 0 or self.update_s is None:
            return True
        return self.schedule.budget_s - trained_s() < 2 * SYNC_EVERY * self.update_s

    def after_update(self, u: int, epoch: int,
                     trained_s: Callable[[], float]) -> tuple[int, bool] | None:
        """After update `u` of epoch `epoch`, with `trained_s()` the training seconds so far:
        (the plan's epochs, whether this epoch ends now, inside it), or None where the clock
        was not read (CUDA, between syncs)."""
        s = self.schedule
        if self.sync is not None and not s.replay:
            if not self._look_now(u, trained_s):
                return None
            self.sync()
        elapsed = trained_s()
        since = max(1, u - self._looked)  # updates since the clock was last read
        self.last_update_s, self._before = (elapsed - self._before) / since, elapsed
        self._looked = u
        total = s.total_at(u) if s.replay else self._plan(u, elapsed)
        if total <= u:  # this was the last update; inside an epoch, the epoch ends now
            return epoch, u % s.per_epoch != 0
        return max(epoch, s.epochs_for(total)), False

    def _plan(self, u: int, elapsed: float) -> int:
        """The plan's total from update `u` on, revised where the clock says so (`elapsed`:
        training seconds so far)."""
        s = self.schedule
        remaining = s.budget_s - elapsed
        if self.first is None:
            self.first, self.started = u - 1, elapsed - self.last_update_s
        if self.mark is None and u - self.first >= UNMEASURED_UPDATES:
            self.mark = (u, elapsed)
        measured = u - self.mark[0] if self.mark else 0
        if remaining <= 0:
            s.revise(u, u)
            if self.update_s is None:  # spent before it was measured: the mean of all so far
                self.update_s = (elapsed - self.started) / (u - self.first)
        elif measured >= MEASURED_UPDATES:
            self.update_s = (elapsed - self.mark[1]) / measured
            epoch_end = math.ceil(u / s.per_epoch) * s.per_epoch
            if (not self.estimated or u % s.per_epoch == 0 or s.total <= epoch_end
                    or remaining < self.update_s):
                # floor: an update that would end past the budget is not planned
                s.revise(u, without_tail(u + math.floor(remaining / self.update_s), u,
                                         s.per_epoch))
                self.estimated = True
        if not self.estimated and s.total <= u and remaining > 0:
            s.revise(u, u + 1)  # the nominal plan is shorter than the measuring: one more
        return s.total_at(u)


def without_tail(total: int, u: int, per_epoch: int) -> int:
    """`total` updates, or the epoch boundary before it (not before update `u`) where the last
    epoch would hold at most TAIL_SHARE of an epoch's updates."""
    tail = total % per_epoch
    if 0 < tail <= TAIL_SHARE * per_epoch and total - tail >= u:
        return total - tail
    return total


def record(budget: Budget, updates: int, epochs: int) -> dict:
    """What `budget_plan.json` holds: the budget, the plan's revisions, what it used, and the
    measured seconds of an update (the mean, and the last one's)."""
    s = budget.schedule
    return {"budget_s": s.budget_s, "updates_per_epoch": s.per_epoch,
            "revisions": s.revisions, "updates": updates, "epochs": epochs,
            "update_s": budget.update_s, "last_update_s": budget.last_update_s,
            "replayed": s.replay}
