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
SECONDS = 1.0  # per op, at most (the first call is always timed)
# Dense TFLOPS per GPU from the vendors' data sheets: (bf16/fp16, TF32, fp32). Matched in this
# order against torch.cuda.get_device_name (an H100 that is not PCIe is taken for SXM).
VENDOR = (("H200", (989.4, 494.7, 66.9)), ("H100 PCIe", (756.0, 378.0, 51.2)),
          ("H100", (989.4, 494.7, 66.9)), ("A100", (312.0, 156.0, 19.5)))


@dataclass
class Peak:
    tflops: float  # what MFU divides by
    how: str  # measured, cached or ACCEL_PEAK_TFLOPS
    matmul_tflops: float | None = None
    conv_tflops: float | None = None
    vendor_tflops: float | None = None  # the data sheet's figure, where the device is listed

    def params(self) -> dict[str, str | float]:
        out = {"resolved.peak_tflops": self.tflops, "resolved.peak_how": self.how}
        for name in ("matmul_tflops", "conv_tflops", "vendor_tflops"):
            if getattr(self, name) is not None:
                out[f"resolved.peak_{name}"] = getattr(self, name)
        return out


def peak(device: torch.device, dtype: torch.dtype | None, conv: tuple | None,
         channels_last: bool = False) -> Peak:
    """The peak for a run on `device` in `dtype` (None: fp32), from ACCEL_PEAK_TFLOPS, the cache
    or the probe. `conv`: accel.flops.Count.heaviest_conv."""
    vendor = vendor_tflops(device, dtype)
    if os.environ.get(ENV):
        return Peak(_from_env(), ENV, vendor_tflops=vendor)
    key = cache_key(device, dtype, conv, channels_last)
    cached = read_cache(CACHE).get(key)
    if isinstance(cached, dict) and cached.get("tflops"):
        return Peak(cached["tflops"], "cached", cached.get("matmul_tflops"),
                    cached.get("conv_tflops"), vendor)
    matmul = _rate(*_matmul(device, dtype))
    conv_rate = _rate(*_conv(device, dtype, conv, channels_last)) if conv else None
    found = Peak(max(matmul, conv_rate or 0.0), "measured", matmul, conv_rate, vendor)
    write_cache(key, {"tflops": found.tflops, "matmul_tflops": matmul,
                      "conv_tflops": conv_rate}, CACHE)
    return found


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


def _matmul(device: torch.device, dtype: torch.dtype | None):
    n = 8192 if device.type == "cuda" else 512
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, generator=g, device=device, dtype=dtype or torch.float32)
            for _ in range(2))
    return (lambda: torch.mm(a, b)), 2.0 * n**3, device


def _conv(device: torch.device, dtype: torch.dtype | None, conv: tuple, channels_last: bool):
    c_in, c_out, kernel, stride, padding, groups, h, w = conv
    layer = torch.nn.Conv2d(c_in, c_out, kernel, stride, padding, groups=groups, bias=False)
    layer = layer.to(device, dtype or torch.float32)
    one = torch.zeros(1, c_in, h, w, device=device, dtype=dtype or torch.float32)
    per_image = 2.0 * layer(one).numel() * c_in // groups * math.prod(kernel)
    target = 2e12 if device.type == "cuda" else 1e9  # a few milliseconds of work per repeat
    batch = max(1, min(4096, int(target // per_image)))
    x = torch.randn(batch, c_in, h, w, device=device, dtype=dtype or torch.float32)
    if channels_last:
        layer, x = layer.to(memory_format=torch.channels_last), x.to(
            memory_format=torch.channels_last)
    return (lambda: layer(x)), per_image * batch, device


@torch.no_grad()
def _rate(fn, flops: float, device: torch.device) -> float:
    """TFLOPS of `fn`'s fastest repeat, warm. Within SECONDS: an op that slow (bf16 on a CPU
    without bf16 instructions) is timed by the repeats that fit, the first one at least."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    times: list[float] = []
    begun = time.perf_counter()
    while len(times) < WARMUP + REPEATS and (not times or time.perf_counter() - begun < SECONDS):
        sync(device)
        started = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - started)
    return flops / min(times[WARMUP:] or times) / 1e12
