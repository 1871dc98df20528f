"""Side-by-side timing: alternate the contenders round by round so drift hits both alike."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


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
    """`lscpu`'s model name and the CPU's bf16 flags (without them torch emulates bf16), or
    what /proc/cpuinfo says where lscpu is missing: the line a benchmark's numbers go beside."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    name = fields.get("Model name", "").strip()
    flags = fields.get("Flags", "").split()
    if not name:
        from accel.tracking.environment import cpu_name

        name = cpu_name()
        flags = _cpuinfo_flags()
    bf16 = [f for f in flags if "bf16" in f] or ["no bf16 flag"]
    return f"{name} ({', '.join(bf16)})"


def _cpuinfo_flags() -> list[str]:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    return next((line.split(":", 1)[1].split() for line in lines
                 if line.startswith("flags")), [])
