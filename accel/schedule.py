"""The learning-rate schedule: a function of (update index, total updates), and the plan that
says what the total is at each update.

A run of `train.epochs` has one plan: epochs x updates per epoch, fixed. A run with
`train.budget_s` starts from that nominal length and revises the total as it measures its own
speed (accel.train.budget); each revision is kept (`revisions`), so the same schedule can be
replayed update by update (`accel reproduce`) or carried on (`accel resume`: the scheduler's state
holds this object's fields).
"""

from __future__ import annotations

import bisect
import math
from typing import Any


def lr_multiplier(update: int, *, total: int, warmup: int, kind: str, start: float = 0.0,
                  end: float = 0.0) -> float:
    """Linear warm-up over `warmup` updates from `start`, then constant, or cosine or linear
    decay to `end` at `total` updates (fractions of the learning rate)."""
    if update < warmup:
        return start + (1.0 - start) * (update + 1) / warmup
    if kind == "constant":
        return 1.0
    progress = min(1.0, (update - warmup) / max(1, total - warmup))
    if kind == "linear":
        return end + (1.0 - end) * (1.0 - progress)
    return end + (1.0 - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


def updates_per_epoch(epoch_length: int, accumulation_steps: int) -> int:
    return math.ceil(epoch_length / accumulation_steps)  # the short last window is an update too


class Schedule:
    """The multiplier of update `u` (LambdaLR calls it with the count of updates so far).

    Its fields are plain numbers and lists, so LambdaLR's state (a checkpoint, read with
    weights_only=True) carries them. With a budget, the warm-up and the whitening bias's hold
    are the shares of the plan that `train.warmup_epochs` and `train.whiten_bias_epochs` are of
    `train.epochs`: the schedule's shape, laid over however many updates the budget allows."""

    def __init__(self, t: Any, per_epoch: int, revisions: list[list[int]] | None = None,
                 replay: bool = False):
        self.kind, self.start, self.end = t.scheduler, t.lr_start, t.lr_end
        self.per_epoch = per_epoch
        self.budget_s = t.budget_s
        self.warmup = round(t.warmup_epochs * per_epoch)  # a fixed plan's warm-up, in updates
        self.warmup_share = t.warmup_epochs / t.epochs
        self.hold_share = (t.whiten_bias_epochs / t.epochs
                           if t.whiten_bias_epochs is not None else None)
        # [[from update, total updates], ...]: the plan, and every revision of it
        self.revisions = [list(r) for r in revisions] if revisions else [[0, t.epochs * per_epoch]]
        self.replay = replay  # a logged plan, replayed: the clock is not read

    def __call__(self, update: int) -> float:
        total = self.total_at(update)
        return lr_multiplier(update, total=total, warmup=self.warmup_at(total), kind=self.kind,
                             start=self.start, end=self.end)

    @property
    def total(self) -> int:
        return self.revisions[-1][1]

    def total_at(self, update: int) -> int:
        """The plan's total as it stood when update `update` was scheduled."""
        i = bisect.bisect_right([r[0] for r in self.revisions], update) - 1
        return self.revisions[max(i, 0)][1]

    def warmup_at(self, total: int) -> int:
        return round(self.warmup_share * total) if self.budget_s else self.warmup

    def revise(self, update: int, total: int) -> None:
        """From update `update` on, the plan is `total` updates (kept only if it changed)."""
        if total == self.total:
            return
        if self.revisions[-1][0] == update:
            self.revisions[-1][1] = total
        else:
            self.revisions.append([update, total])

    def hold_due(self, update: int) -> bool:
        """A budgeted run: the whitening bias is held once `update` updates reach its share."""
        return self.hold_share is not None and update >= round(self.hold_share
                                                               * self.total_at(update))

    def epochs_for(self, total: int) -> int:
        return max(1, math.ceil(total / self.per_epoch))


def build_scheduler(optimizer, t: Any, epoch_length: int, *,
                    revisions: list[list[int]] | None = None, replay: bool = False):
    """Stepped once per optimizer update, so the schedule does not depend on accumulation."""
    import torch

    per_epoch = updates_per_epoch(epoch_length, t.accumulation_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, Schedule(t, per_epoch, revisions, replay))
