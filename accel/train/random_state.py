"""The random states a run keeps (Python, NumPy, torch, CUDA): read and set for its checkpoint,
and kept around work that must not move them (the amp probe, the loader's look past its last
batch)."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import torch


@contextlib.contextmanager
def kept_random_states():
    """Python, NumPy and torch random states as they were on entry, again on exit."""
    states = random_states()
    try:
        yield
    finally:
        set_random_states(states)


def random_states() -> dict[str, Any]:
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        # As plain tensors and numbers: weights_only loading takes no NumPy arrays.
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def set_random_states(states: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(states["python"])
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
