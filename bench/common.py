"""Side-by-side timing: alternate the contenders round by round so drift hits both alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def time_rounds(contenders: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Seconds per round for each contender, run in alternation after one warm-up call each."""
    for fn in contenders.values():
        fn()  # warm-up: allocator, oneDNN kernel selection, lazy imports
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> str:
    med = statistics.median(times)
    return (
        f"median {med * 1000:8.1f} ms  min {min(times) * 1000:8.1f}  max {max(times) * 1000:8.1f}"
    )


def ratio(times: dict[str, list[float]], num: str, den: str) -> tuple[float, float, float]:
    """Median ratio num/den and the min..max of the per-round ratios (the spread)."""
    per_round = [a / b for a, b in zip(times[num], times[den], strict=True)]
    return (
        statistics.median(times[num]) / statistics.median(times[den]),
        min(per_round),
        max(per_round),
    )


def print_ratio(times: dict[str, list[float]], num: str, den: str, label: str, fmt: str) -> None:
    """The closing line every benchmark prints: the median ratio and its per-round spread."""
    med, lo, hi = ratio(times, num, den)
    rounds = len(times[num])
    print(f"{label}: {med:{fmt}}  (per-round {lo:{fmt}}..{hi:{fmt}}, {rounds} rounds)")


def cpu_line() -> str:
    """The CPU's kind (accel.tracking.environment.cpu_name: model name, family and model, bf16
    instructions, or that it has none: then torch emulates bf16), the line a benchmark's numbers
    go beside."""
    from accel.tracking.environment import BF16_FLAGS, cpu_name

    name = cpu_name()
    return name if any(flag in name for flag in BF16_FLAGS) else f"{name}, no bf16 flag"
