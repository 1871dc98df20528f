"""Host-device synchronisations per update in steady state: each one makes the host wait for
the GPU, so the next update's kernels are not queued while this one runs (a `.item()` per batch
serialises the GPU).

Two counts, after a warm-up, over `--updates` updates:
- reads: calls of `Tensor.item`, `__bool__`, `__float__`, `__int__`, `tolist` (each a sync on a
  device tensor), made by accel's `UpdateStep` alone and by one iteration of accel's Ignite
  trainer (`create_trainer`: the step plus its per-update handlers); any device;
- CUDA: the syncs torch reports under `torch.cuda.set_sync_debug_mode("warn")`, which sees the
  ones inside torch (a GradScaler's inf check, `nonzero`, ...) too; CUDA only.

    python -m checks.gpu.syncs              # on the GPU (`make gpu-check`)
    python -m checks.gpu.syncs --dry-run    # on the CPU: the reads only
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import types
import warnings
from collections import Counter

import torch

from checks.gpu.records import emit

READS = ("item", "__bool__", "__float__", "__int__", "tolist")


@contextlib.contextmanager
def count_reads(device: torch.device):
    """A Counter of the host reads of values of tensors on `device` made inside the block, by
    method name. Left out: torch.optim's reads of 0-dim CPU tensors, the counters it keeps on
    the host whatever the device (an optimizer's step count with `capturable=False`, a moving
    average's `n_averaged`): no sync even on a GPU."""
    counts: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in READS}
    optim = os.path.dirname(torch.optim.__file__) + os.sep

    def host_counter(t: torch.Tensor) -> bool:
        caller = sys._getframe(2).f_code.co_filename
        return t.device.type == "cpu" and t.dim() == 0 and caller.startswith(optim)

    def counting(name, original):
        def read(self, *args, **kwargs):
            if self.device.type == device.type and not host_counter(self):
                counts[name] += 1
            return original(self, *args, **kwargs)
        return read

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, counting(name, original))
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@contextlib.contextmanager
def count_cuda_syncs():
    """A list that ends up holding torch's sync warnings raised inside the block (CUDA)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode("default")


def make_step(amp: str, device: torch.device, model_name: str, accumulation: int = 1):
    """accel's UpdateStep on a timm model: AdamW, clipping, a schedule, a moving average."""
    import timm

    from accel.config import TrainConfig
    from accel.engine import UpdateStep, build_optimizer, build_scaler, moving_average, resolve_amp

    model = timm.create_model(model_name, num_classes=10).to(device)
    t = TrainConfig(optimizer="adamw", lr=1e-3, amp=amp, accumulation_steps=accumulation)
    dtype = resolve_amp(amp, device)
    optimizer = build_optimizer(model, t, fused=dtype is torch.float16)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: 1 / (1 + u / 100))
    ema = moving_average(model, 0.99)
    step = UpdateStep(model, optimizer, torch.nn.CrossEntropyLoss(), device,
                      accumulation_steps=accumulation, amp_dtype=dtype,
                      scaler=build_scaler(dtype, device), clip_grad_norm=1.0,
                      scheduler=schedule,
                      after_update=lambda skipped: ema.update_parameters(model, skipped))
    return step


def fake_engine(epoch_length: int = 10**6):
    """What UpdateStep reads of an Ignite engine: the iteration and the epoch's length."""
    return types.SimpleNamespace(state=types.SimpleNamespace(iteration=0, epoch=1,
                                                             epoch_length=epoch_length))


def step_reads(step, batch, updates: int, warmup: int = 3) -> Counter:
    """Host reads made by `step` over `updates` updates after `warmup` (no Ignite around it)."""
    engine = fake_engine()
    n = step.accumulation_steps
    for _ in range(warmup * n):
        engine.state.iteration += 1
        step(engine, batch)
    with count_reads(step.device) as counts:
        for _ in range(updates * n):
            engine.state.iteration += 1
            step(engine, batch)
    return counts


def trainer_reads(step, batch, updates: int, attach=None) -> tuple[Counter, list]:
    """Host reads (and CUDA syncs) of the second epoch of accel's trainer around `step`: each
    iteration with the trainer's own per-update handlers, and what `attach(trainer)` adds (the
    progress bar a terminal gets)."""
    from ignite.engine import Events

    from accel.engine import create_trainer

    trainer = create_trainer(step)
    if attach is not None:
        attach(trainer)
    cuda = step.device.type == "cuda"
    stack = contextlib.ExitStack()
    found: dict = {}

    @trainer.on(Events.EPOCH_STARTED(once=2))
    def _start(_):
        found["reads"] = stack.enter_context(count_reads(step.device))
        found["cuda"] = stack.enter_context(count_cuda_syncs()) if cuda else []

    @trainer.on(Events.EPOCH_COMPLETED(once=2))
    def _end(_):
        if cuda:
            torch.cuda.synchronize()
        stack.close()

    trainer.run([batch] * updates, max_epochs=2)
    return found["reads"], list(found["cuda"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="on the CPU: host reads only")
    ap.add_argument("--updates", type=int, default=50)
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.dry_run else "cuda")
    model, batch_size, size = ("test_resnet", 8, 32) if args.dry_run else ("resnet18", 512, 32)
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(batch_size, 3, size, size, generator=gen).to(device),
             torch.randint(0, 10, (batch_size,), generator=gen).to(device))
    for amp in ("off", "bf16", "fp16"):
        step = make_step(amp, device, model)
        alone = step_reads(step, batch, args.updates)
        whole, cuda = trainer_reads(step, batch, args.updates)
        per = lambda c: round(sum(c.values()) / args.updates, 2)  # noqa: E731
        emit(step="syncs", amp=amp, model=model, updates=args.updates,
             step_reads=per(alone), trainer_reads=per(whole),
             reads_by=dict(whole), cuda_syncs=None if args.dry_run else len(cuda) / args.updates,
             cuda_where=sorted({str(w.message).splitlines()[0][:100] for w in cuda})[:3])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
