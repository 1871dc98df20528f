"""`train.amp=auto`: the precision a run trains in, decided where it runs.

On CUDA: bf16 where the GPU has it, else fp16 with loss scaling. On a CPU whether bf16 pays
depends on the CPU and the model (1.75x on a Zen 5 EPYC, 2.97x on a Xeon with AMX, 0.87x on an
older EPYC, slower than fp32 on a Xeon with avx512_bf16 and no AMX visible: docs/results.md), so
a probe times this model's update step at this batch size in bf16 and in fp32 (copies of the
model, a batch of random images, a few seconds); bf16 wins only by a margin (`MARGIN`, or the
probe's own spread where that is larger), else fp32 stays; two warm steps decide alone
where one takes twice the other's (bf16 without bf16 instructions, AVX2 only). The answer is
cached per CPU model, torch version, thread count, model and batch shape (`amp_probe.json` under
$ACCEL_CACHE_DIR, else ~/.cache/accel): a study pays the probe once. The run logs the decision
and both timings; `accel reproduce` and `accel resume` train in what the run chose.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

WARMUP_STEPS = 2  # per precision: oneDNN builds its kernels on the first step
ROUNDS = 3  # alternating rounds, so that a change in the machine's load hits both alike
STEPS_PER_ROUND = 2  # at least; a small model takes as many as last ROUND_S
ROUND_S = 0.2
# A warm step this many times the other precision's decides at once: the rounds could not turn
# it, and on a CPU without bf16 instructions (AVX2 only) bf16 steps take 15x fp32's, so that
# 6 more of them would cost minutes.
DECISIVE = 2.0
# bf16 is chosen only where it beats fp32 by MARGIN (5%) and by more than the probe's own
# round-to-round spread: a 2.7% gap between two timings of one noisy machine is no reason to
# train in a lower precision.
MARGIN = 0.05
CACHE = "amp_probe.json"
DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}
NAMES = {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class AmpDecision:
    """What `train.amp` resolved to here, and why."""

    dtype: torch.dtype | None
    how: str  # asked (train.amp names it), cuda, measured, cached, replayed
    fp32_s: float | None = None  # seconds per update in the probe
    bf16_s: float | None = None
    margin: float | None = None  # the relative gain bf16 had to beat (MARGIN or the spread)

    @property
    def mode(self) -> str:
        return NAMES[self.dtype]

    def tags(self) -> dict[str, str]:
        return {"accel.amp_auto": self.mode, "accel.amp_probe": self.how}

    def metrics(self) -> dict[str, float]:
        if self.fp32_s is None or self.bf16_s is None:
            return {}
        margin = {"amp_probe_margin": self.margin} if self.margin is not None else {}
        return {"amp_probe_fp32_s": self.fp32_s, "amp_probe_bf16_s": self.bf16_s, **margin}

    def line(self) -> str:
        said = f"train.amp=auto: {self.mode} ({self.how}"
        if self.fp32_s is not None and self.bf16_s is not None:
            said += (f": {self.bf16_s * 1000:.1f} ms an update in bf16, "
                     f"{self.fp32_s * 1000:.1f} ms in fp32")
            if self.margin is not None:
                gain = 1 - self.bf16_s / self.fp32_s
                said += (f"; bf16 {100 * gain:+.1f}% against a {100 * self.margin:.1f}% "
                         "margin")
        return said + ")"


def decide(mode: str, device: torch.device, model: torch.nn.Module, cfg, shape: tuple[int, ...],
           classes: int, replayed: str | None = None) -> AmpDecision:
    """The precision for `train.amp=mode` on `device`; `shape` is one batch's (B, C, H, W) of
    images in `classes` classes; `replayed` is what a logged run chose (its reproduce or resume
    trains in it)."""
    if mode != "auto":
        return AmpDecision(DTYPES[mode], "asked")
    if replayed is not None:
        return AmpDecision(DTYPES[replayed], "replayed")
    if device.type == "cuda":
        from accel.engine import native_bf16

        bf16 = native_bf16()
        return AmpDecision(torch.bfloat16 if bf16 else torch.float16, "cuda")
    key = cache_key(model, cfg, shape)
    cached = read_cache().get(key)
    if cached is not None:
        return AmpDecision(DTYPES[cached["choice"]], "cached", cached["fp32_s"],
                           cached["bf16_s"], cached.get("margin"))
    times = probe(model, cfg, device, shape, classes)
    choice, margin = choose(times)
    write_cache(key, {"choice": choice, "fp32_s": times["fp32"], "bf16_s": times["bf16"],
                      "margin": margin})
    return AmpDecision(DTYPES[choice], "measured", times["fp32"], times["bf16"], margin)


def choose(times: dict[str, float]) -> tuple[str, float]:
    """("bf16" or "off", the margin bf16 had to beat): bf16 where its update is shorter than
    fp32's by MARGIN and by the probe's own spread (`times["spread"]`, where rounds ran)."""
    margin = max(MARGIN, times.get("spread", 0.0))
    return ("bf16" if times["bf16"] < (1 - margin) * times["fp32"] else "off"), margin


def probe(model: torch.nn.Module, cfg, device: torch.device, shape: tuple[int, ...],
          classes: int, rounds: int = ROUNDS) -> dict[str, float]:
    """Median seconds per update of copies of `model` in fp32 and in bf16 autocast, on random
    batches of `shape`, and ("spread") the larger relative range of the rounds' timings; the
    process's random states are left as they were. Where one warm step is DECISIVE times the
    other's, those two steps are the answer."""
    from accel.train.random_state import kept_random_states

    with kept_random_states():
        steps = {"fp32": _step(model, cfg, device, None, shape, classes),
                 "bf16": _step(model, cfg, device, torch.bfloat16, shape, classes)}
        warm = {name: _warm_up(step) for name, step in steps.items()}  # s of a warm step
        if max(warm.values()) >= DECISIVE * min(warm.values()):
            return warm
        n = max(STEPS_PER_ROUND, math.ceil(ROUND_S / max(max(warm.values()), 1e-6)))
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                start = time.perf_counter()
                for _ in range(n):
                    step()
                times[name].append((time.perf_counter() - start) / n)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    spread = max((max(ts) - min(ts)) / medians[name] for name, ts in times.items())
    return {**medians, "spread": spread}


def _warm_up(step) -> float:
    """Runs WARMUP_STEPS steps; the seconds of the last."""
    for _ in range(WARMUP_STEPS):
        start = time.perf_counter()
        step()
    return time.perf_counter() - start


def _step(model: torch.nn.Module, cfg, device: torch.device, dtype, shape, classes: int):
    """One update of a copy of `model` as the run would make it (its optimizer, its memory
    format, the bf16 conv guard), on a fixed random batch."""
    from accel import engine

    copied = copy.deepcopy(model).to(device)
    if cfg.train.channels_last:
        copied = copied.to(memory_format=torch.channels_last)
    if dtype is torch.bfloat16:
        engine.guard_cpu_bf16_convs(copied)
    optimizer = engine.build_optimizer(copied, cfg.train)
    update = engine.UpdateStep(copied, optimizer, torch.nn.CrossEntropyLoss(), device,
                               amp_dtype=dtype, channels_last=cfg.train.channels_last)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    y = torch.randint(0, classes, (shape[0],), generator=g)
    state = SimpleNamespace(state=SimpleNamespace(iteration=1, epoch_length=1))
    return lambda: update(state, (x, y))


def cache_key(model: torch.nn.Module, cfg, shape: tuple[int, ...]) -> str:
    """CPU model, torch version, threads, the model (its name and its layers' shapes) and the
    batch: what the answer depends on."""
    from accel.tracking.environment import cpu_name

    layers = hashlib.sha256(repr(model).encode()).hexdigest()[:12]
    return " | ".join([cpu_name(), f"torch {torch.__version__}",
                       f"{torch.get_num_threads()} threads", f"{cfg.model.name} {layers}",
                       "batch " + "x".join(map(str, shape)),
                       "channels_last" if cfg.train.channels_last else "contiguous"])


def cache_path(name: str = CACHE) -> Path:
    from accel.shared_data import run_cache_dir

    return run_cache_dir() / name


def read_cache(name: str = CACHE) -> dict:
    try:
        data = json.loads(cache_path(name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(key: str, entry: dict, name: str = CACHE) -> None:
    """Adds one answer to the cache file `name` (a temporary file renamed: a reader never sees
    half of one). A cache that cannot be written costs a probe next time, nothing else."""
    path = cache_path(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**read_cache(name), key: entry}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass
