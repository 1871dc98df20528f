"""The Ignite trainer and evaluator, and the one update step (GA + AMP + clipping).

Ignite's `create_supervised_trainer` has accumulation and fp16 AMP, but no clipping and no bf16,
and its accumulation windows straddle epochs without flushing a short last window. So the step is
our own process function, `UpdateStep`, with the order of operations in plain sight.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from ignite.engine import Engine

from accel.averaging import MovingAverage, moving_average  # noqa: F401 (the step's EMA)
from accel.config import TrainConfig
from accel.param_groups import param_groups
from accel.schedule import (  # noqa: F401 (the schedule, where the step is built)
    Schedule,
    build_scheduler,
    lr_multiplier,
    updates_per_epoch,
)
from accel.timing import EpochClock

OPTIMIZER_NAMES = {"adam": "adam", "adamw": "adamw", "sgd": "momentum", "nesterov": "sgd"}
# ours -> timm's: timm's "sgd" is Nesterov SGD; "momentum" is classical heavy-ball SGD, the usual
# "SGD" of papers. muon: accel.muon, with one of these for what Muon does not take.


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from accel.config import ConfigError

        raise ConfigError("train.device=cuda but no CUDA device is visible; use cpu or auto")
    return torch.device(name)


def resolve_amp(mode: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `train.amp` on this device; None means full fp32."""
    if mode == "off":
        return None
    if mode == "bf16":
        return torch.bfloat16
    if mode == "fp16":
        return torch.float16
    if device.type == "cuda":  # auto
        return torch.bfloat16 if native_bf16() else torch.float16
    # auto on CPU without a probe is fp32; a run's train.amp=auto measures bf16 against fp32
    # (accel.train.amp_probe); train.amp=bf16 asks for bf16 autocast (see guard_cpu_bf16_convs).
    return None


def native_bf16() -> bool:
    """Whether this GPU computes bf16 itself (Ampere and later): torch's default answer counts
    emulation too (V100, T4), where bf16 is slower than fp16 with loss scaling."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


def set_tf32(on: bool, device: torch.device) -> None:
    """train.tf32 for matmuls and cuDNN convolutions together (CUDA): TF32 keeps fp32's range
    with a 10-bit mantissa, several times fp32's tensor-core throughput on Ampere and later.
    PyTorch's own defaults disagree (cuDNN on, matmul off), so an `amp=off` run would mix them."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def build_optimizer(model: torch.nn.Module, t: TrainConfig, *,
                    fused: bool = False) -> torch.optim.Optimizer:
    """timm's factory: no weight decay on norm layers and biases (filter_bias_and_bn); with
    `train.bn_bias_lr_scale`, the BatchNorm biases in a group of their own at that multiple of
    the learning rate (the schedule scales every group alike), the whitening bias too, and with
    train.whiten_bias_lr_scale or bn_bias_decay (accel.param_groups). Frozen parameters are
    left out.
    `fused` (fp16): torch's fused kernels, which skip an update with inf/NaN gradients on the
    device, so GradScaler never reads its inf check on the host. `muon`: Muon for the body's
    matrices, `train.muon_rest` as built here for the rest (accel.muon)."""
    from timm.optim import create_optimizer_v2

    name = t.muon_rest if t.optimizer == "muon" else t.optimizer
    kwargs = {"momentum": t.momentum} if name in ("sgd", "nesterov") else {}
    if fused:
        kwargs["fused"] = True
    make = functools.partial(create_optimizer_v2, opt=OPTIMIZER_NAMES[name], lr=t.lr,
                             weight_decay=t.weight_decay, **kwargs)
    if t.optimizer == "muon":
        from accel.muon import build_muon

        return build_muon(model, param_groups(model, t), make, t)
    plain = (t.bn_bias_lr_scale == 1 and not t.bn_bias_decay and t.whiten_bias_lr_scale is None)
    return make(model if plain else param_groups(model, t))


def build_scaler(amp_dtype: torch.dtype | None, device: torch.device):
    """fp16 needs loss scaling to keep small gradients from underflowing; bf16 and fp32 do not."""
    if amp_dtype is torch.float16:
        return torch.amp.GradScaler(device.type)
    return None


@dataclass
class EpochStats:
    """Sums kept as device tensors during the epoch; read (one sync) when the epoch ends."""

    loss_sum: torch.Tensor | float = 0.0
    micro_batches: int = 0
    samples: int = 0
    updates: int = 0  # windows closed, skipped ones too (fp16: inf/NaN gradients)
    grad_norm_sum: torch.Tensor | float = 0.0  # the pre-clip norms of the applied updates
    skipped_updates: torch.Tensor | float = 0.0  # fp16: updates the scaler skipped

    def summary(self) -> dict[str, float]:
        """The epoch's means; with several ranks, train_loss over every rank's micro-batches and
        `samples` summed (the ranks' gradients, and so their norms, are the same)."""
        from accel.ranks import sum_over_ranks

        skipped = float(self.skipped_updates)
        return {
            "train_loss": sum_over_ranks(float(self.loss_sum))
            / max(1.0, sum_over_ranks(self.micro_batches)),
            "grad_norm": float(self.grad_norm_sum) / max(1.0, self.updates - skipped),
            "skipped_updates": skipped,
            "samples": sum_over_ranks(self.samples),
        }


class HeldParameter:
    """A parameter that trains for `epochs` epochs and then stays where they left it
    (train.whiten_bias_epochs): from the next epoch on, put back after every update. One process
    then stops its gradient too (`drop_grad`), which spares the backward pass the gradient of
    everything below it (for the whitening bias: the first convolution's input gradient, 5% of
    a step of the fast recipe). Several ranks keep it and its place in the optimizer, so their
    gradient buckets stay whole. A resumed run holds the value its checkpoint has, which is
    that one."""

    def __init__(self, param: torch.nn.Parameter, epochs: int, *, drop_grad: bool = False,
                 schedule: Schedule | None = None):
        self.param, self.epochs, self.drop_grad = param, epochs, drop_grad
        self.schedule = schedule  # a budgeted run: held once its share of the plan is done
        self.value: torch.Tensor | None = None

    def hold_for_epoch(self, epoch: int, updates: int) -> None:
        """At an epoch's start: held from the epoch after `epochs` (a budgeted run: once its
        share of the plan is done, `updates` so far; a resumed run holds from its start)."""
        if epoch > self.epochs if self.schedule is None else self.schedule.hold_due(updates):
            self.hold()

    def hold_when_due(self, updates: int) -> None:
        """After an update (a budgeted run): from the update its share ends with."""
        if self.schedule is not None and self.value is None and self.schedule.hold_due(updates):
            self.hold()

    def hold(self) -> None:
        self.value = self.param.detach().clone()
        if self.drop_grad:
            self.param.requires_grad_(False)
            self.param.grad = None

    def put_back(self) -> None:
        if self.value is not None:
            with torch.no_grad():
                self.param.copy_(self.value)


class UpdateStep:
    """One micro-batch forward/backward; at the end of each accumulation window, one update.

    Windows never straddle epochs: with 10 micro-batches and 4 steps per window the updates come
    after micro-batches 4, 8 and 10, and the last window's loss is divided by 2, not 4, so every
    update averages the gradients of the samples it saw.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable,
        device: torch.device,
        *,
        accumulation_steps: int = 1,
        amp_dtype: torch.dtype | None = None,
        scaler=None,
        clip_grad_norm: float | None = None,
        scheduler=None,
        channels_last: bool = False,
        non_blocking: bool = False,
        after_update: Callable[[torch.Tensor | None], None] | None = None,
        clock: EpochClock | None = None,
    ):
        self.model, self.optimizer, self.loss_fn, self.device = model, optimizer, loss_fn, device
        self.accumulation_steps = accumulation_steps
        self.amp_dtype, self.scaler = amp_dtype, scaler
        self.clip_grad_norm = clip_grad_norm
        self.scheduler = scheduler
        self.channels_last, self.non_blocking = channels_last, non_blocking
        self.clock = clock if clock is not None else EpochClock(device)  # the epoch's split
        self.after_update = after_update  # e.g. a moving average of the new weights; told
        # `skipped` (fp16: a device tensor, 1.0 for an update the scaler skipped; else None)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.updates = 0
        self.stats = EpochStats()
        self.skipped: torch.Tensor | None = None  # fp16: 1.0 on the device if the last update
        # was skipped, else 0.0; what follows an update weighs by it without reading it

    def window_of(self, iteration: int, epoch_length: int) -> tuple[int, bool]:
        """(size of the window this micro-batch belongs to, whether it is the window's last)."""
        i = (iteration - 1) % epoch_length  # 0-based position in the epoch
        start = i - i % self.accumulation_steps
        size = min(self.accumulation_steps, epoch_length - start)
        return size, i == start + size - 1

    def __call__(self, engine: Engine, batch) -> dict[str, torch.Tensor]:
        self.model.train()
        self.clock.step_started()
        x, y = move_batch(batch, self.device, self.non_blocking, self.channels_last)
        self.clock.copied()
        window_size, closes_window = self.window_of(engine.state.iteration,
                                                    engine.state.epoch_length)

        # Several ranks (DistributedDataParallel) average their gradients once per window, in
        # the backward pass of its last micro-batch; the others accumulate locally (no_sync).
        local = self.model.no_sync() if hasattr(self.model, "no_sync") and not closes_window \
            else contextlib.nullcontext()
        with local:
            with autocast(self.device, self.amp_dtype):
                loss = self.loss_fn(self.model(x), y)
            scaled = loss / window_size  # the window's gradient: the mean over its micro-batches
            if self.scaler is not None:
                scaled = self.scaler.scale(scaled)
            scaled.backward()

        loss = loss.detach()
        self.stats.loss_sum += loss
        self.stats.micro_batches += 1
        self.stats.samples += len(y)
        out = {"loss": loss}
        if closes_window:
            out.update(self.update())
        self.clock.step_ended()
        return out

    def update(self) -> dict[str, torch.Tensor]:
        """unscale -> clip -> step -> scaler update -> zero_grad -> scheduler, once per window.
        An update the fp16 scaler skips (inf/NaN gradients) moves neither the weights, nor the
        optimizer's state, nor the moving average, and its norm is left out of the epoch's mean,
        all decided on the device from the scaler's inf check (`self.skipped`), never read by
        the host. The schedule and the update count count it as a step taken, as the budget's
        clock does (docs/gpu-check.md#fp16-a-skipped-update-decided-on-the-device)."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clip and report true gradient magnitudes
            found = self.scaler._found_inf_per_device(self.optimizer).values()
            self.skipped = sum(f.to(self.device, non_blocking=True) for f in found).clamp(max=1)
        max_norm = self.clip_grad_norm if self.clip_grad_norm is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)  # norm before clipping
        out = {"grad_norm": grad_norm.detach()}
        if self.scaler is not None:
            # A fused optimizer takes the inf check from the scaler and skips on the device;
            # any other reads it on the host once (torch's GradScaler.step).
            self.scaler.step(self.optimizer)
            self.scaler.update()
            out["loss_scale"] = self.scaler._get_scale_async().detach().clone()  # on the device
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1  # counted before what follows an update, which reads the count
        if self.after_update is not None:
            self.after_update(self.skipped)
        if self.scheduler is not None:
            self.scheduler.step()
        self.stats.updates += 1
        if self.skipped is None:
            self.stats.grad_norm_sum += grad_norm.detach()
        else:  # a skipped update's norm is inf or NaN: left out of the mean, and counted
            self.stats.grad_norm_sum += torch.where(self.skipped > 0, 0.0, grad_norm.detach())
            self.stats.skipped_updates += self.skipped
        return out


def guard_cpu_bf16_convs(model: torch.nn.Module) -> None:
    """oneDNN's bf16 weight gradient of a convolution whose input is one pixel wide or high while
    its kernel is larger (the stride-2 3x3 conv at the end of a ResNet fed 16 px images) is
    wrong: the taps that see only padding get whatever memory held, now and then NaN
    (torch 2.14, Xeon with AMX and EPYC with avx512_bf16 alike; `bench/bf16_cpu_conv.py`). Under
    CPU autocast such a conv runs in fp32; any other input takes the usual path."""
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d) and max(module.kernel_size) > 1:
            module.forward = functools.partial(_conv_forward_guarded, module)


def unguard_convs(model: torch.nn.Module) -> None:
    """Undo `guard_cpu_bf16_convs` (a model leaving the trainer, to be logged)."""
    for module in model.modules():
        module.__dict__.pop("forward", None)


def _conv_forward_guarded(conv: torch.nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    one_pixel = any(size == 1 < k for size, k in zip(x.shape[-2:], conv.kernel_size, strict=True))
    if one_pixel and x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            return type(conv).forward(conv, x.float())
    return type(conv).forward(conv, x)


def autocast(device: torch.device, dtype: torch.dtype | None):
    """Mixed precision on `device` in `dtype`; a no-op context for full fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype)


def move_batch(batch, device: torch.device, non_blocking: bool, channels_last: bool):
    x, y = batch
    x = x.to(device, non_blocking=non_blocking)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y.to(device, non_blocking=non_blocking)


def create_trainer(step: UpdateStep) -> Engine:
    """The Ignite engine around `step`. No per-update handler reads the loss: a NaN/inf loss
    is caught at the end of its epoch, where the epoch's summed loss (kept on the device) is
    read anyway (accel.train.run), so the host never waits for the device per update."""
    return Engine(step)


def tta_logits(model: Callable, x: torch.Tensor, tta: str) -> torch.Tensor:
    """The logits an evaluation scores (fp32). `none`: the model's; `flip`: the mean of the
    image's and its mirror image's; `multicrop` (airbench): 1/2 the flip mean of the image, 1/4
    each the flip means of the image moved by 1 px up-left and down-right (reflect-padded by 1,
    then cropped back to its size)."""
    if tta == "none":
        return model(x).float()

    def mirrored(v: torch.Tensor) -> torch.Tensor:
        return (model(v).float() + model(v.flip(-1)).float()) / 2

    if tta == "flip":
        return mirrored(x)
    h, w = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="reflect")
    moved = (mirrored(padded[..., :h, :w]) + mirrored(padded[..., 2:, 2:])) / 2
    return (mirrored(x) + moved) / 2


def create_evaluator(
    model: torch.nn.Module,
    num_classes: int,
    device: torch.device,
    *,
    amp_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    non_blocking: bool = False,
    tta: str = "none",
) -> Engine:
    """Accuracy, macro F1, cross-entropy loss and the confusion matrix over a loader. `tta`:
    see `tta_logits`; the evaluator's `tta` attribute, which a run may change between two
    evaluations (eval.tta_every_epoch)."""
    from ignite.metrics import Accuracy, ConfusionMatrix, Fbeta, Loss

    @torch.inference_mode()
    def eval_step(engine: Engine, batch):
        model.eval()
        x, y = move_batch(batch, device, non_blocking, channels_last)
        with autocast(device, amp_dtype):
            logits = tta_logits(model, x, engine.tta)
        return logits, y

    evaluator = Engine(eval_step)
    evaluator.tta = tta
    Accuracy(device=device).attach(evaluator, "accuracy")
    Fbeta(1.0, average=True, device=device).attach(evaluator, "f1")  # unweighted mean = macro
    Loss(torch.nn.CrossEntropyLoss(), device=device).attach(evaluator, "loss")
    ConfusionMatrix(num_classes, device=device).attach(evaluator, "confusion_matrix")
    return evaluator
