"""Decoded image folders kept on disk: a split of image files held in memory or on the device
(`data.in_memory`, `data.on_device`) is decoded once per machine, not once per process.

Decoding CIFAR-10's 60,000 JPEGs is most of a run's start-up on a 2-core CPU
(docs/benchmarks.md), and a study's trials in their own processes, `accel reproduce` and every
budgeted run paid it again. The decoded uint8 array [N, H, W, C] is saved as one `.npy` file
under `decoded/` of the run cache ($ACCEL_CACHE_DIR, else ~/.cache/accel), named by a digest of
what was decoded: each file's absolute path, size, modification time and label, in order, and
the colour mode. A file added, removed, relabelled or rewritten gives another name, so a copy
that no longer matches the folder is never read (the same test as the per-process file digests
of accel.tracking.lineage). Loading refuses pickles; a copy that cannot be read, or whose
length is not the split's, is decoded again; where the cache cannot be written, the split is
decoded as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from accel.shared_data import run_cache_dir

FORMAT = 1  # bump when what is saved changes


def cache_file(samples: Sequence[tuple[str, int]], mode: str) -> Path:
    """Where the split of these (path, label) samples, decoded in `mode`, is kept."""
    h = hashlib.sha256(f"accel decoded {FORMAT} {mode}\n".encode())
    for path, label in samples:
        path = os.path.abspath(path)
        st = os.stat(path)
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{label}\n".encode())
    return run_cache_dir() / "decoded" / f"{h.hexdigest()[:32]}.npy"


def load_or_decode(samples: Sequence[tuple[str, int]], mode: str,
                   decode: Callable[[], np.ndarray]) -> np.ndarray:
    """The split's images [N, H, W, C]: the kept copy, else `decode()`, kept for next time."""
    path = cache_file(samples, mode)
    try:
        images = np.load(path, allow_pickle=False)
        if images.ndim == 4 and len(images) == len(samples):
            return images
    except (OSError, ValueError):  # none yet, or unreadable
        pass
    images = decode()
    keep(path, images)
    return images


def keep(path: Path, images: np.ndarray) -> None:
    """Write `images` to `path` whole or not at all (a temporary file, then a rename), so a
    process stopped mid-write, or two writing at once, never leave half an array."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".decoding-", suffix=".npy", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            np.save(f, images, allow_pickle=False)
        os.replace(tmp, path)
    except OSError:  # a read-only or full disk: the run goes on without the copy
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)
