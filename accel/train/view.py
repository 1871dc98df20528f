"""What a run's parts read of it: `RunView`, the fields of `accel.train.run.Run` that the
checkpoint (capture, restore), the epochs' loop and the MLflow side take. They annotate with this
Protocol instead of importing `Run`, which imports them: the order of events stays on `Run`, and
no module of accel.train imports another back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from ignite.engine import Engine

    from accel.averaging import Lookahead, MovingAverage
    from accel.config import Config
    from accel.data import Data
    from accel.engine import UpdateStep
    from accel.flops import Count
    from accel.train.amp_probe import AmpDecision
    from accel.train.budget import Budget
    from accel.train.loader import Batches
    from accel.train.peak import Peak


class RunView(Protocol):
    cfg: Config
    device: torch.device
    data: Data
    bare: torch.nn.Module
    step: UpdateStep
    trainer: Engine
    evaluator: Engine
    amp: AmpDecision
    epoch_length: int
    batches: Batches
    budget: Budget | None
    averaged: MovingAverage | None
    lookahead: Lookahead | None
    history: list[dict[str, float]]
    best_state: dict[str, torch.Tensor] | None
    rank_random_states: list[dict] | None
    log: Any  # accel.train.run_log.RunLog, which reads a run through this view itself
    flops: Count | None
    peak: Peak | None
    splits: list[dict[str, float]]

    @property
    def amp_dtype(self) -> torch.dtype | None: ...

    @property
    def scored(self) -> torch.nn.Module: ...
