"""Where the train loader stands: `Batches`, the loader as the trainer reads it, which a
checkpoint records so that a resumed run starts at the same batch of the same shuffle."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from accel.train.random_state import kept_random_states

if TYPE_CHECKING:
    from accel.timing import EpochClock

_END = object()  # the loader's last batch was handed out


class Batches:
    """The train loader as the trainer reads it. Each pass over the loader starts from a recorded
    state of its shuffling generator and counts the batches it hands out, so a checkpoint can put
    a resumed run at the same batch of the same shuffle: with `train.epoch_length` shorter than
    the loader, one pass (one shuffle) spans several epochs."""

    def __init__(self, loader, clock: EpochClock | None = None):
        self.loader, self.clock = loader, clock
        self.generator: torch.Generator = loader.generator
        self.pass_start = self.generator.get_state()
        self.taken = 0  # batches handed out by the current pass
        self.pass_number = 0  # the loader's count of passes when this one began (a resident
        # loader's alternating flips depend on it)
        self._skip = 0  # batches to skip when the next pass starts (a resumed run)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        skip, self._skip = self._skip, 0
        self.pass_start, self.taken = self.generator.get_state(), 0
        self.pass_number = getattr(self.loader, "passes", 0)
        batches = iter(self.loader)
        if skip:
            with kept_random_states():  # skipped batches must not move the augmentations' RNG
                for _ in range(skip):
                    next(batches)
            self.taken = skip
        while True:
            waited = time.perf_counter()
            batch = next(batches, _END)
            if self.clock is not None:  # the epoch's data wait (accel.timing)
                self.clock.waited(time.perf_counter() - waited)
            if batch is _END:
                return
            self.taken += 1
            if self.taken == len(self.loader):
                finish_pass(batches)
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"pass_start": self.pass_start, "taken": self.taken,
                "generator": self.generator.get_state(), "passes": self.pass_number}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        inside = 0 < state["taken"] < len(self.loader)
        if inside:  # stopped inside a pass: replay its shuffle
            self.generator.set_state(state["pass_start"])
            self._skip = state["taken"]
        else:  # at a pass boundary: the next pass starts from the generator as it was
            self.generator.set_state(state["generator"])
        if hasattr(self.loader, "passes"):  # the pass replayed, or the one after
            self.loader.passes = state.get("passes", 0) + (0 if inside or not state["taken"]
                                                           else 1)


def finish_pass(batches) -> None:
    """Run a loader's iterator past its last batch. A sampler may draw from the generator on
    the way out (torch's RandomSampler draws one more permutation); done here, before the last
    batch is handed out, that draw lands before the epoch's checkpoint instead of after it, when
    the trainer asks the next epoch for a batch, and a resumed run starts its next pass from the
    same generator state as the run that never stopped."""
    for _ in batches:
        raise RuntimeError("the train loader handed out more batches than its length")
