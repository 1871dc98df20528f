"""The moving average of a model's weights that a run scores (train.ema_decay): torch's
AveragedModel, with an update that never makes the host wait for the device; and airbench's
Lookahead (train.lookahead_decay), an average written back into the weights it averages."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


def moving_average(model: torch.nn.Module, decay: float):
    """An exponential moving average of `model`'s weights and buffers (BatchNorm statistics
    too): a copy on the model's device, updated by `update_parameters(model)`."""
    average = MovingAverage(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
    average.decay = decay
    return average


class MovingAverage(AveragedModel):
    """torch's AveragedModel (its state_dict, its `module`) with an update that never waits for
    the device: torch's reads its `n_averaged` counter twice per update and copies it to the
    device (`.to(device)`: a blocking copy from pageable memory). Here the counter stays a host
    tensor, bumped in place; whether the first update has happened is a Python flag (set from
    the counter once, after a checkpoint is loaded).

    `skipped` (fp16): a device tensor, 1.0 where the scaler skipped the update just made; the
    average then stays where it is (its weight on the new weights is 0), with no host read."""

    decay: float | None = None

    def update_parameters(self, model: torch.nn.Module,
                          skipped: torch.Tensor | None = None) -> None:
        averaged = list(itertools.chain(self.module.parameters(), self.module.buffers()))
        current = [p.detach() for p in itertools.chain(model.parameters(), model.buffers())]
        started = getattr(self, "_started", None)
        if started is None:  # once per process (a resumed run: the loaded counter says)
            started = self._started = bool(self.n_averaged.cpu() > 0)
        with torch.no_grad():
            if not started:
                torch._foreach_copy_(averaged, current)
                self._started = True
            else:  # the EMA, grouped by dtype as torch groups it (integer buffers apart)
                groups: dict[torch.dtype, list[int]] = {}
                for i, p in enumerate(averaged):
                    groups.setdefault(p.dtype, []).append(i)
                for group in groups.values():
                    ours, theirs = [averaged[i] for i in group], [current[i] for i in group]
                    if skipped is None:
                        self.multi_avg_fn(ours, theirs, None)
                    else:
                        _weighted_step(ours, theirs, (1 - self.decay) * (1 - skipped))
        self.n_averaged.add_(1)

    def load_state_dict(self, *args, **kwargs):
        self._started = None  # read the loaded counter again
        return super().load_state_dict(*args, **kwargs)


def _weighted_step(averaged: list[torch.Tensor], current: list[torch.Tensor],
                   weight: torch.Tensor) -> None:
    """averaged += weight x (current - averaged), `weight` a device tensor (0 leaves them)."""
    if averaged[0].is_floating_point():
        torch._foreach_lerp_(averaged, current, weight.to(averaged[0].dtype))
    else:  # integer buffers (BatchNorm's batch count), rounded as torch's EMA rounds them
        for a, c in zip(averaged, current, strict=True):
            a.copy_(a + (c - a) * weight)


class Lookahead:
    """airbench94's Lookahead (its `LookaheadState`, stepped as its `train` steps it): an
    average of the network's state (its weights and floating buffers, BatchNorm's running
    statistics among them; airbench iterates `net.state_dict()` and skips what is not float)
    that, after every `every`-th update u, moves toward the network,

        average = decay_u x average + (1 - decay_u) x net,   decay_u = decay^every x (u / T)^3

    and is then copied into the network, which trains on from there. T is the plan's total
    updates as it stands after update u (`plan(u)`: a budgeted run's revisions too). After the
    plan's last update the network takes the average (decay 1: airbench's final
    `update(net, decay=1.0)`), so the updates since the last write-back are dropped. The decay
    is a host number of the update count: nothing waits for the device."""

    def __init__(self, model: torch.nn.Module, decay: float, every: int,
                 plan: Callable[[int], int]):
        self.model, self.decay, self.every, self.plan = model, decay, every, plan
        state = model.state_dict()  # uncompiled; its tensors share the parameters' storage
        self.average = {k: v.detach().clone() for k, v in state.items() if v.is_floating_point()}

    def decay_at(self, update: int) -> float | None:
        """The decay after update `update` (counted from 1), None where nothing happens."""
        total = self.plan(update)
        if update % self.every == 0:  # at the plan's end too: the network then is the average
            return self.decay ** self.every * min(1.0, update / total) ** 3
        return 1.0 if update == total else None

    def after_update(self, update: int) -> bool:
        """The average moved and written back after update `update` (True), or left (False)."""
        decay = self.decay_at(update)
        if decay is None:
            return False
        state = self.model.state_dict()
        ours, theirs = list(self.average.values()), [state[k] for k in self.average]
        with torch.no_grad():
            torch._foreach_lerp_(ours, theirs, 1.0 - decay)
            torch._foreach_copy_(theirs, ours)
        return True

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"average": dict(self.average)}

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]] | None) -> None:
        """A checkpoint's average (KeyError: the checkpoint has none, or another model's)."""
        average = (state or {}).get("average")
        if average is None:
            raise KeyError("the checkpoint holds no Lookahead average")
        if set(average) != set(self.average):
            raise KeyError(f"the Lookahead's average holds {len(average)} tensors, this "
                           f"model's {len(self.average)}")
        with torch.no_grad():
            for name, value in average.items():
                self.average[name].copy_(value)
