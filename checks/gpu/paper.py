"""The paper's question at 224 px: how much faster does accel's update step train ResNet50, a
ViT and EfficientNet-B0 with TF32, bf16 or fp16 autocast, channels_last, GA, PM and compile?

CIFAR-10 training images are held on the device as uint8 and resized once there to 224 px. Each
measurement builds the model afresh, runs `--warmup` updates (kernel selection, allocator), then
times three blocks of updates of accel's own `UpdateStep` (accel.engine), each between two
synchronisations, with cuDNN's autotuner on as in training: img/s = the blocks' median (their
range beside it), peak memory = torch.cuda.max_memory_allocated. A measurement is printed
(checks.gpu.records) as soon as it ends, so the step's timeout keeps what was done.

    python -m checks.gpu.paper --budget 200           # on the GPU (what `make gpu-check` runs)
    python -m checks.gpu.paper --dry-run              # tiny timm models at 64 px on the CPU
"""

from __future__ import annotations

import argparse
import os
import time
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from checks.gpu.records import emit

MODELS = ("resnet50", "vit_base_patch16_224", "efficientnet_b0")
DRY_MODELS = ("test_resnet", "test_vit", "test_efficientnet")
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
# Seconds a compile measurement is given at least: a cold torch.compile of a training step of
# these models takes tens of seconds to minutes (max-autotune longer); 60 s cut some short.
COMPILE_NEEDS_S = 120
BLOCKS = 3  # timed blocks per measurement: its img/s is their median, their range its spread


@dataclass
class Mode:
    name: str
    amp: str = "off"  # off / bf16 / fp16 (fp16 with a GradScaler)
    tf32: bool = True
    channels_last: bool = False
    accumulation: int = 1  # micro-batches per update at the same effective batch
    loader: str = ""  # "" (resident), "dataloader", "dataloader+pm"
    compile: str = ""  # "" or a train.compile mode


def modes(convnet: bool) -> list[Mode]:
    """The precision modes in the order measured; channels_last only where convolutions are."""
    out = [Mode("fp32 (TF32 off)", tf32=False), Mode("TF32"), Mode("bf16", "bf16"),
           Mode("fp16 + GradScaler", "fp16")]
    if convnet:
        out += [Mode("bf16 + channels_last", "bf16", channels_last=True),
                Mode("fp16 + channels_last", "fp16", channels_last=True)]
    return out


def fastest(rows: list[dict]) -> Mode:
    """The fastest AMP mode measured so far: the base of the GA, PM and compile rows."""
    amp = [r for r in rows if r["amp"] != "off" and "img_s" in r] or rows
    best = max(amp, key=lambda r: r.get("img_s", 0))
    return Mode(best["mode"], best["amp"], True, best["channels_last"])


def build(name: str, size: int, m: Mode, device: torch.device):
    """Model, UpdateStep (accel's own, AdamW) and its memory format for one measurement."""
    import timm

    from accel.config import TrainConfig
    from accel.engine import UpdateStep, build_optimizer, build_scaler, resolve_amp
    from accel.models import compile_model

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = m.tf32
    torch.backends.cudnn.benchmark = True  # as `accel train` runs (accel.train.parts)
    model = timm.create_model(name, num_classes=10, img_size=size) if "vit" in name else \
        timm.create_model(name, num_classes=10)
    model = model.to(device)
    if m.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if m.compile:
        model = compile_model(model, m.compile)
    t = TrainConfig(optimizer="adamw", lr=1e-3, accumulation_steps=m.accumulation, amp=m.amp)
    amp = resolve_amp(m.amp, device)
    optimizer = build_optimizer(model, t, fused=amp is torch.float16)  # as accel builds it
    return UpdateStep(model, optimizer, torch.nn.CrossEntropyLoss(), device,
                      accumulation_steps=m.accumulation, amp_dtype=amp,
                      scaler=build_scaler(amp, device), channels_last=m.channels_last,
                      non_blocking=m.loader.endswith("pm"))


def batches(images: torch.Tensor, labels: torch.Tensor, batch: int, m: Mode, device):
    """Endless normalised batches: sliced on the device, or through a DataLoader from host
    memory (pinned with PM), as accel's DataLoader path moves them."""
    shift = torch.tensor(MEAN, device=device).view(1, -1, 1, 1) * 255
    scale = torch.tensor(STD, device=device).view(1, -1, 1, 1) * 255
    if not m.loader:
        while True:
            for i in range(0, len(labels) - batch + 1, batch):
                yield (images[i:i + batch].float() - shift) / scale, labels[i:i + batch]
    from torch.utils.data import DataLoader, TensorDataset

    # host memory holds normalised float images, as a torchvision transform leaves them
    few = slice(0, min(len(labels), 8 * batch))
    host = TensorDataset(((images[few].float() - shift) / scale).cpu(), labels[few].cpu())
    workers = 2 if device.type == "cuda" else 0
    loader = DataLoader(host, batch_size=batch, shuffle=True, drop_last=True,
                        num_workers=workers, pin_memory=m.loader.endswith("pm"),
                        persistent_workers=workers > 0)
    while True:
        yield from loader


def measure(name: str, m: Mode, data, args, device) -> dict:
    """One measurement: warm-up, then `args.updates` timed updates; img/s and peak memory."""
    images, labels = data
    micro = args.batch // m.accumulation
    step = build(name, images.shape[-1], m, device)
    feed = batches(images, labels, micro, m, device)
    engine = types.SimpleNamespace(state=types.SimpleNamespace(iteration=0, epoch_length=10**9))

    def updates(n: int) -> None:
        for _ in range(n * m.accumulation):
            engine.state.iteration += 1
            step(engine, next(feed))

    updates(args.warmup)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    speeds = []
    for _ in range(BLOCKS):
        began = time.perf_counter()
        updates(args.updates)
        sync(device)
        speeds.append(args.updates * args.batch / (time.perf_counter() - began))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    img_s = sorted(speeds)[BLOCKS // 2]
    out = {"img_s": img_s, "img_s_min": min(speeds), "img_s_max": max(speeds),
           "peak_gib": peak, **utilisation(name, images.shape[-1], m, img_s, device)}
    if m.loader:  # what crosses the loader: float32 host batches, through /dev/shm by workers
        out["host_batch_mb"] = micro * 3 * images.shape[-1] ** 2 * 4 / 2**20
    return out


def utilisation(name: str, size: int, m: Mode, img_s: float, device: torch.device) -> dict:
    """The row's achieved TFLOPS and MFU against the peak measured here in its precision
    (accel.train.peak) and against the data sheet's figure where the GPU is listed."""
    import timm

    from accel.engine import resolve_amp
    from accel.flops import count_training_flops
    from accel.train.peak import peak

    with torch.device("meta"):
        model = timm.create_model(name, num_classes=10, **({"img_size": size}
                                                          if "vit" in name else {}))
    count = count_training_flops(model, (3, size, size))
    top = peak(device, resolve_amp(m.amp, device), count.heaviest_conv, m.channels_last)
    achieved = img_s * count.per_image / 1e12
    return {"tflops": achieved, "peak_tflops": top.tflops, "mfu": achieved / top.tflops,
            "vendor_tflops": top.vendor_tflops,
            "mfu_vendor": achieved / top.vendor_tflops if top.vendor_tflops else None}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def record(model: str, m: Mode, result: dict) -> dict:
    row = {"model": model, "mode": m.name, "amp": m.amp, "tf32": m.tf32,
           "channels_last": m.channels_last, "accumulation": m.accumulation,
           "loader": m.loader, "compile": m.compile, **result}
    emit(step="paper", **row)
    return row


def attempt(name: str, m: Mode, data, args, device) -> dict:
    """A measurement, or its error as the row (an OOM, a compile failure: the table says so)."""
    try:
        result = measure(name, m, data, args, device)
    except Exception as e:  # noqa: BLE001 - every failure is a result of this check
        result = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return record(name, m, result)


def extra_modes(base: Mode, args, dry: bool) -> list[Mode]:
    """GA at the same effective batch, and the DataLoader path without and with PM."""
    def like(name: str, **kw) -> Mode:
        return Mode(f"{base.name}, {name}", base.amp, base.tf32, base.channels_last, **kw)

    pm = "dataloader+pm" if not dry else ""  # pinning needs CUDA
    out = [like(f"GA {args.accumulation}x{args.batch // args.accumulation}",
                accumulation=args.accumulation), like("DataLoader", loader="dataloader")]
    return out + ([like("DataLoader + PM", loader=pm)] if pm else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny models on the CPU")
    ap.add_argument("--budget", type=float, default=200, help="seconds for the whole step")
    args = ap.parse_args(argv)
    dry, deadline = args.dry_run, time.monotonic() + args.budget
    device = torch.device("cpu" if dry else "cuda")
    args.size, args.batch, args.warmup, args.updates, args.accumulation = \
        (64, 8, 1, 2, 2) if dry else (224, 256, 5, 8, 4)  # updates: per timed block
    data = resident_data(args, device)
    models = DRY_MODELS if dry else MODELS
    bases = {}
    for name in models:  # value first: every model's precision table before GA, PM, compile
        rows = [attempt(name, m, data, args, device)
                for m in modes(convnet="vit" not in name) if time.monotonic() < deadline]
        bases[name] = fastest(rows) if rows else None
    for name, base in bases.items():
        for m in extra_modes(base, args, dry) if base else []:
            if time.monotonic() < deadline:
                attempt(name, m, data, args, device)
    compile_rows(bases, data, args, device, deadline, dry)
    return 0


def compile_rows(bases: dict, data, args, device, deadline: float, dry: bool) -> None:
    """train.compile on each model's fastest mode, in the modes time leaves."""
    for mode in ("default", "reduce-overhead", "max-autotune"):
        for name, base in bases.items():
            left = deadline - time.monotonic()
            if base is None:
                continue
            m = Mode(f"{base.name}, compile {mode}", base.amp, True, base.channels_last,
                     compile=mode)
            if dry or left < COMPILE_NEEDS_S:
                why = "dry run: compile is tested on the CPU by tests" if dry else \
                    f"{left:.0f} s left of the step, a compile needs {COMPILE_NEEDS_S}"
                record(name, m, {"skipped": why})
                continue
            attempt(name, m, data, args, device)


def resident_data(args, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Enough training images for every measurement, uint8 on the device at `args.size` px
    (resized there once, bilinear with antialias)."""
    from accel.shared_data import cifar10_jpeg
    from checks.gpu.cifar import split

    root = Path(os.environ["ACCEL_DATA"]) if os.environ.get("ACCEL_DATA") else cifar10_jpeg()
    n = args.batch * (args.warmup + BLOCKS * args.updates) * 2
    images, labels, _ = split(root, "train", limit=n)
    x = images.to(device).permute(0, 3, 1, 2).float()
    x = torch.nn.functional.interpolate(x, size=args.size, mode="bilinear", antialias=True)
    return x.round().clamp(0, 255).to(torch.uint8).contiguous(), labels.to(device)


if __name__ == "__main__":
    raise SystemExit(main())
