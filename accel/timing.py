"""Where an epoch's time goes: waiting for data, the host-to-device copy, compute (forward,
backward, optimizer), evaluation and record (best weights, checkpoint), each as seconds.

The update step marks three moments of every micro-batch: its start, its batch on the device,
its end. On a CPU each mark is a `perf_counter` reading (the CPU runs each op before the next
line). On a GPU each is a CUDA event recorded in the stream, read once at the epoch's end,
where the epoch waits for the device anyway, so the split adds no host read per update
(tests/test_syncs.py). The data wait is the host's time inside the loader's `next()` on a CPU;
on a GPU it is the device's idle time between one micro-batch's end and the next one's start
(what the GPU waited for: the batch, or the host's dispatch). Evaluation and record are timed
by the run (accel.train.run), on the host after a sync. What none of these holds (Ignite's
loop and handlers, the epoch's start) is `other`, logged too: the parts are measured, not
made to add up.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PARTS = ("data", "copy", "compute", "eval", "record", "other")  # time_<part>_s, in this order


class EpochClock:
    """One epoch's marks, kept by the update step (`start` resets them)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.start()

    def start(self) -> None:
        """At the epoch's start, after the device's queued work (accel.train.run)."""
        self.data_s = 0.0  # host seconds in the loader's next() (CPU)
        self.marks: list[tuple] = []  # (start, copied, end) per micro-batch
        self.opened = self._mark()  # the epoch's first moment on the device (CUDA)
        self._open: list = []
        self.training: dict[str, float] = {}  # data, copy, compute: read once training ends
        self.eval_s, self.evaluated_at = 0.0, time.perf_counter()

    def _mark(self):
        if self.cuda:
            import torch  # a GPU run has it loaded; this module stays light for `accel best`

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def waited(self, seconds: float) -> None:
        """The host waited `seconds` for the loader's next batch."""
        self.data_s += seconds

    def step_started(self) -> None:
        self._open = [self._mark()]

    def copied(self) -> None:
        self._open.append(self._mark())

    def step_ended(self) -> None:
        if len(self._open) == 2:
            self.marks.append((*self._open, self._mark()))
        self._open = []

    def trained(self) -> None:
        """The epoch's training is over and the device has done its work: its split is read."""
        self.training = self.training_split()

    def evaluated(self, started: float) -> None:
        """The epoch's evaluation, begun at perf_counter `started`, is over."""
        self.evaluated_at = time.perf_counter()
        self.eval_s = self.evaluated_at - started

    def training_split(self) -> dict[str, float]:
        """{data, copy, compute}: seconds of the epoch's training so far. Call it after the
        device has finished the epoch's work (a GPU's events are complete then)."""
        if not self.cuda:
            copy = sum(c - s for s, c, _ in self.marks)
            compute = sum(e - c for _, c, e in self.marks)
            return {"data": self.data_s, "copy": copy, "compute": compute}
        ms = {"data": 0.0, "copy": 0.0, "compute": 0.0}
        before = self.opened
        for start, copied, end in self.marks:
            ms["data"] += before.elapsed_time(start)  # the device idle, waiting for the host
            ms["copy"] += start.elapsed_time(copied)
            ms["compute"] += copied.elapsed_time(end)
            before = end
        return {part: value / 1000.0 for part, value in ms.items()}


def split_row(training: dict[str, float], eval_s: float, record_s: float,
              wall_s: float) -> dict[str, float]:
    """The epoch's split as logged: time_<part>_s for every part of PARTS (`other`: the epoch's
    wall time that no part holds; negative where parts overlap), and the wall time itself."""
    parts = {**training, "eval": eval_s, "record": record_s}
    parts["other"] = wall_s - sum(parts.values())
    return {**{f"time_{p}_s": parts[p] for p in PARTS}, "epoch_wall_s": wall_s}


def split_said(metrics: dict[str, float]) -> str:
    """`data 3% copy 0% compute 81% eval 12% record 3% other 1%` from an epoch's logged split,
    or "" where it has none."""
    wall = metrics.get("epoch_wall_s")
    if not wall or any(f"time_{p}_s" not in metrics for p in PARTS):
        return ""
    return " ".join(f"{p} {100 * metrics[f'time_{p}_s'] / wall:.0f}%" for p in PARTS)
