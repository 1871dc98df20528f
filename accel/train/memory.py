"""The process's memory, tuned in one place: glibc's allocator (whether freed blocks stay
with the process), handing freed pages back, and a fresh start of the peak-memory count and of
the garbage collector for each run of a process that runs many (a study, an ablation).

glibc's settings and the collector's frozen generation belong to the process, not to a run:
`_kept` is this module's one piece of process-wide state (tests/test_run_order.py names it)."""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

import torch


def _libc_function(name: str):
    """glibc's function `name` (ctypes), or None on another C library."""
    import ctypes
    import ctypes.util

    libc = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(libc), name, None) if libc and "libc.so" in libc else None


def release_freed_memory() -> None:
    """Hands what the process keeps (`keep_freed_memory`) back to the kernel now: before a
    measurement of one run's peak memory in a process that ran others (`accel ablate`)."""
    malloc_trim = _libc_function("malloc_trim")
    if malloc_trim is not None:
        malloc_trim(0)


def keep_freed_memory(keep: bool) -> bool:
    """train.keep_freed_memory, for this process (glibc only; returns whether it applied). A
    CPU training step frees and allocates again activations of tens of MB; glibc hands every
    block over its mmap threshold back to the kernel when freed and maps it afresh, so each step
    page-faults its activations in again (40,000 faults a step for the fast recipe, whose epoch
    that made 1.37x as long: `bench/cpu_step.py`). Kept, such blocks are reused from the heap,
    as jemalloc or tcmalloc would. Off after on (a study's next trial): glibc's default limits,
    128 KiB each; off in a process that never kept: nothing changes."""
    global _kept
    mallopt = _libc_function("mallopt")
    if mallopt is None or not (keep or _kept):
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    mmap_max, trim = (0, 2**31 - 1) if keep else (65536, 128 * 1024)
    _kept = keep
    return bool(mallopt(m_mmap_max, mmap_max)) and bool(mallopt(m_trim_threshold, trim))


_kept = False  # whether keep_freed_memory(True) is in force


def start_fresh(device_name: str) -> None:
    """`peak_memory_mb` is this run's own peak, not the process's so far: a study runs many
    trials in one process. On CPU it is the resident high-water mark (getrusage's ru_maxrss),
    which Linux starts again from the current size when "5" is written to clear_refs; where
    that file is missing (not Linux) the peak stays the process's."""
    from accel.engine import resolve_device

    device = resolve_device(device_name)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    gc.collect()  # an earlier trial's tensors, and the heap pages they held, go back first
    # What survives (the libraries, the study) is left out of every later collection: a full one
    # walks the ~700k objects of torch, MLflow and Ignite, 0.34 s, half of a tiny trial's time.
    # After the collection, so no earlier trial's garbage is kept for good.
    gc.freeze()
    release_freed_memory()  # glibc keeps freed pages otherwise
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
