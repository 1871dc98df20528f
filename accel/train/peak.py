"""The machine's peak FLOP rate in the run's precision, measured where the run trains: what a
run's MFU (model FLOP utilisation) is measured against.

A vendor's figure is no peak for a CPU, and a table of GPUs misses the next one (an unknown
device read as an A100 has given MFU above 100% elsewhere), so the probe times, warm, a large
matrix multiply and a convolution shaped like the model's heaviest layer, in the run's
precision (TF32 where the run allows it), a few repeats each, and keeps the fastest rate of
either. Cached like the `train.amp=auto` probe (keyed by device, torch version, threads,
precision and the convolution's shape): a study pays it once. Where the GPU's dense figure is
known (A100, H100, H200) it is logged beside the measured peak, never used in its place.
`ACCEL_PEAK_TFLOPS` sets the peak for users who know better (the run logs that it did).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch

from accel.config import ConfigError
from accel.train.amp_probe import read_cache, write_cache

CACHE = "peak_probe.json"
ENV = "ACCEL_PEAK_TFLOPS"
WARMUP, REPEATS = 2, 5
SECONDS = {"cuda": 1.0, "cpu": 1.0}  # per op, at most (the first call is always timed)
# Dense TFLOPS per GPU from the vendors' data sheets: (bf16/fp16, TF32, fp32). Matched in this
# order against torch.cuda.get_device_name (an H100 that is not PCIe is taken for SXM).
VENDOR = (("H200", (989.4, 494.7, 66.9)), ("H100 PCIe", (756.0, 378.0, 51.2)),
          ("H100", (989.4, 494.7, 66.9)), ("A100", (312.0, 156.0, 19.5)))


@dataclass
class Peak:
    tflops: float  # what MFU divides by
    how: str  # measured, cached, achieved (a run outran the probes) or ACCEL_PEAK_TFLOPS
    matmul_tflops: float | None = None
    conv_tflops: float | None = None
    vendor_tflops: float | None = None  # the data sheet's figure, where the device is listed

    def metrics(self) -> dict[str, float]:
        """Logged as metrics (step 0), not params: a measurement differs between a run and its
        rerun, whose params are the run's."""
        out = {"peak_tflops": self.tflops}
        for name in ("matmul_tflops", "conv_tflops", "vendor_tflops"):
            if getattr(self, name) is not None:
                out[f"peak_{name}"] = getattr(self, name)
        return out


def peak(device: torch.device, dtype: torch.dtype | None, conv: tuple | None,
         channels_last: bool = False, *, again: bool = False, at_least: float = 0.0) -> Peak:
    """The peak for a run on `device` in `dtype` (None: fp32), from ACCEL_PEAK_TFLOPS, the cache
    or the probe. `conv`: accel.flops.Count.heaviest_conv. `again`: probe even where the cache
    has an answer (a run went faster than it), and keep the higher of the two: a busy machine
    can only make a probe read low. `at_least`: a rate a run achieved here (TFLOPS); where
    every probe reads below it, it is the highest rate known on this machine and so the peak
    (how: "achieved"), cached for the runs after; without `again`, a cached peak below it is
    raised to it unprobed (a probe already read low here)."""
    vendor = vendor_tflops(device, dtype)
    if os.environ.get(ENV):
        return Peak(_from_env(), ENV, vendor_tflops=vendor)
    key = cache_key(device, dtype, conv, channels_last)
    cached = read_cache(CACHE).get(key)
    cached = cached if isinstance(cached, dict) and cached.get("tflops") else None
    known = Peak(cached["tflops"], "cached", cached.get("matmul_tflops"),
                 cached.get("conv_tflops"), vendor) if cached else None
    if known and not again:
        if known.tflops >= at_least:
            return known
        found = known  # raised to the run's rate below, without probing
    else:
        found = _probe_aside(device, dtype, conv, channels_last, vendor, again)
        if known and known.tflops > found.tflops:
            found = known
    if at_least > found.tflops:
        found = Peak(at_least, "achieved", found.matmul_tflops, found.conv_tflops, vendor)
    write_cache(key, {"tflops": found.tflops, "matmul_tflops": found.matmul_tflops,
                      "conv_tflops": found.conv_tflops}, CACHE)
    return found


def _probe_aside(device: torch.device, dtype: torch.dtype | None, conv: tuple | None,
                 channels_last: bool, vendor: float | None, again: bool) -> Peak:
    """The probe, leaving the run as it found it: its random streams (the probe's layer and
    inputs draw from them, and whether it runs depends on the cache and the machine's speed,
    so a rerun or a resume could not replay those draws) and, on a GPU, its free memory. A probe
    again in mid-run that finds no memory left is no peak (the run's own rate decides)."""
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            return _probe(device, dtype, conv, channels_last, vendor)
    except torch.cuda.OutOfMemoryError:
        if not again:
            raise
        return Peak(0.0, "measured", vendor_tflops=vendor)
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _probe(device: torch.device, dtype: torch.dtype | None, conv: tuple | None,
           channels_last: bool, vendor: float | None) -> Peak:
    """The fastest of the probes. A CPU is probed in fp32 too: one without bf16 or fp16
    instructions runs those precisions through fp32 arithmetic (oneDNN converts), so its fp32
    rate is the ceiling a step in them can reach."""
    dtypes = [dtype] if device.type == "cuda" or dtype is None else [dtype, None]
    matmul = max(_rate(*_matmul(device, d)) for d in dtypes)
    conv_rate = max(_rate(*_conv(device, d, conv, channels_last)) for d in dtypes) \
        if conv else None
    return Peak(max(matmul, conv_rate or 0.0), "measured", matmul, conv_rate, vendor)


def _from_env() -> float:
    text = os.environ[ENV]
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{ENV}={text!r} is not a peak: give TFLOPS as a positive number "
                          "(e.g. 989.4), or unset it to measure the peak")
    return value


def vendor_tflops(device: torch.device, dtype: torch.dtype | None) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    column = 0 if dtype is not None else 1 if torch.backends.cuda.matmul.allow_tf32 else 2
    return next((figures[column] for part, figures in VENDOR if part in name), None)


def cache_key(device: torch.device, dtype: torch.dtype | None, conv: tuple | None,
              channels_last: bool) -> str:
    from accel.tracking.environment import cpu_name

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    tf32 = device.type == "cuda" and dtype is None and torch.backends.cuda.matmul.allow_tf32
    return " | ".join([where, f"torch {torch.__version__}", f"{torch.get_num_threads()} threads",
                       str(dtype or "fp32") + (" tf32" if tf32 else ""), f"conv {conv}",
                       "channels_last" if channels_last else "contiguous"])


def _matmul(device: torch.device, dtype: torch.dtype | None, n: int | None = None):
    n = n or (8192 if device.type == "cuda" else 1024 if dtype is None else 512)  # an emulated
    # precision on a CPU: within seconds
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, generator=g, device=device, dtype=dtype or torch.float32)
            for _ in range(2))
    return (lambda: torch.mm(a, b)), 2.0 * n**3, device


def _conv(device: torch.device, dtype: torch.dtype | None, conv: tuple, channels_last: bool,
          target: float | None = None):
    c_in, c_out, kernel, stride, padding, groups, h, w = conv
    layer = torch.nn.Conv2d(c_in, c_out, kernel, stride, padding, groups=groups, bias=False)
    layer = layer.to(device, dtype or torch.float32)
    one = torch.zeros(1, c_in, h, w, device=device, dtype=dtype or torch.float32)
    with torch.no_grad():
        out_shape = layer(one).shape[1:]
    per_image = 2.0 * math.prod(out_shape) * c_in // groups * math.prod(kernel)
    # a tenth of a second of work per repeat on a CPU: a batch of a few images reads 12% below
    # the rate of the model's own batches (bench/peak_probe.py); an emulated precision, less
    target = target or (2e12 if device.type == "cuda" else 8e9 if dtype is None else 2.5e8)
    batch = max(1, min(4096, int(target // per_image)))
    x = torch.randn(batch, c_in, h, w, device=device, dtype=dtype or torch.float32)
    if channels_last:
        layer, x = layer.to(memory_format=torch.channels_last), x.to(
            memory_format=torch.channels_last)
    x.requires_grad_(True)
    grad = torch.ones(batch, *out_shape, device=device, dtype=x.dtype)

    def forward_backward():  # as a training step runs it: input and weight gradients
        with torch.enable_grad():
            layer(x).backward(grad)

    return forward_backward, 3 * per_image * batch, device


@torch.no_grad()
def _rate(fn, flops: float, device: torch.device) -> float:
    """TFLOPS of `fn`'s fastest repeat, warm. Within SECONDS: an op that slow (bf16 on a CPU
    without bf16 instructions) is timed by the repeats that fit, the first one at least."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    times: list[float] = []
    begun = time.perf_counter()
    limit = SECONDS.get(device.type, 1.0)
    while len(times) < WARMUP + REPEATS and (not times or time.perf_counter() - begun < limit):
        sync(device)
        started = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - started)
    return flops / min(times[WARMUP:] or times) / 1e12
