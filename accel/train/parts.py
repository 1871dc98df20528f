"""Everything one run is made of (data, model, update step, trainer, evaluator), built from a
config before anything is logged, as an `accel.train.run.Run`."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from accel import engine, models, ranks
from accel.averaging import Lookahead
from accel.config import Config, ConfigError
from accel.console import note
from accel.errors import one_line
from accel.flops import Count, count_training_flops
from accel.schedule import Schedule, updates_per_epoch
from accel.train import amp_probe, launch, memory
from accel.train.budget import Budget
from accel.train.loader import Batches
from accel.train.peak import Peak, peak
from accel.train.run import Run


@dataclass
class Replay:
    """What a logged run decided on its machine, decided the same again: the precision
    `train.amp=auto` chose (reproduce, resume) and a budgeted run's plan (reproduce)."""

    amp: str | None = None  # off, bf16 or fp16
    revisions: list[list[int]] | None = None  # accel.schedule.Schedule.revisions


def build(cfg: Config, replay: Replay | None = None) -> Run:
    """Data, model, update step, trainer and evaluator for `cfg` (nothing logged yet)."""
    from accel.data import build_data

    t = cfg.train
    models.check_model_name(cfg.model.name)  # a bad name fails before any data is read
    device = launch.device_of(t.device)
    if device.type == "cpu":
        memory.keep_freed_memory(t.keep_freed_memory)
    seed_everything(t.seed, t.deterministic)
    engine.set_tf32(t.tf32, device)
    data = build_data(cfg, device)
    while cfg.notes:  # the data is there: what the config adapted to it, said once
        note(cfg.notes.pop(0))
    bare = models.build_model(cfg, data.num_classes, data.in_chans, data.img_size)
    if cfg.model.whiten:
        from accel.resident import first_images

        models.fit_whitening(bare, first_images(data.train.dataset, cfg.model.whiten_images))
    model = models.prepare_model(bare, cfg, device)

    amp = precision(cfg, device, bare, data, replay)
    amp_dtype = amp.dtype
    notes = [amp.line()] if amp.how == "measured" else []  # cached: logged, not said again
    epoch_length = t.epoch_length or len(data.train)
    if not t.epoch_length:  # train.epoch_length set: the user chose the epoch's size
        notes += _once(few_updates(data.train, t.accumulation_steps, epoch_length))
    optimizer = engine.build_optimizer(model, t, fused=amp_dtype is torch.float16)
    averaged = engine.moving_average(bare, t.ema_decay) if t.ema_decay else None
    revisions = replay.revisions if replay else None  # a logged plan: replayed
    schedule = Schedule(t, updates_per_epoch(epoch_length, t.accumulation_steps), revisions,
                        replay=bool(revisions))
    budget = Budget(schedule, device) if t.budget_s else None
    lookahead = (Lookahead(bare, t.lookahead_decay, t.lookahead_every, schedule.total_at)
                 if t.lookahead_decay else None)  # over the plan the schedule follows
    non_blocking = data.train.pin_memory  # async host-to-device copies need pinned batches
    step = engine.UpdateStep(
        _trained(model, cfg, device),  # several ranks: DistributedDataParallel
        optimizer, torch.nn.CrossEntropyLoss(label_smoothing=t.label_smoothing), device,
        accumulation_steps=t.accumulation_steps,
        amp_dtype=amp_dtype,
        scaler=engine.build_scaler(amp_dtype, device),
        clip_grad_norm=t.clip_grad_norm,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
        channels_last=t.channels_last,
        non_blocking=non_blocking,
    )
    scored = averaged.module if averaged is not None else model
    evaluator = engine.create_evaluator(scored, data.num_classes, device, amp_dtype=amp_dtype,
                                        channels_last=t.channels_last, non_blocking=non_blocking,
                                        tta=cfg.eval.tta if cfg.eval.tta_every_epoch else "none")
    count, top = _speed(bare, data, device, amp_dtype, t.channels_last)
    return Run(cfg, device, data, bare, step, engine.create_trainer(step), evaluator, amp,
               epoch_length, Batches(data.train, step.clock), budget=budget,
               held=_held_bias(t, bare, schedule if budget else None), averaged=averaged,
               lookahead=lookahead, notes=notes, flops=count, peak=top)


def _speed(bare: torch.nn.Module, data, device: torch.device, amp_dtype: torch.dtype | None,
           channels_last: bool) -> tuple[Count | None, Peak | None]:
    """What one training image costs, and the machine's peak in the run's precision: rank 0's
    (it logs the run's MFU). A model the FLOP counter cannot trace runs without MFU."""
    if ranks.rank() != 0:
        return None, None
    try:
        count = count_training_flops(bare, (data.in_chans, data.img_size, data.img_size))
    except Exception as e:  # a model's op that the meta device lacks
        note(f"this run logs no MFU: its FLOPs could not be counted ({one_line(e)})")
        return None, None
    return count, peak(device, amp_dtype, count.heaviest_conv, channels_last)


def _trained(model: torch.nn.Module, cfg: Config, device: torch.device) -> torch.nn.Module:
    """What the update step runs: `model`; with several ranks, DistributedDataParallel around
    the eager module (its BatchNorms synchronised with train.sync_bn), compiled after the wrap
    when train.compile asks: DDP around a compiled model cannot overlap its gradient all-reduce
    with the backward, while a compiled DDP splits its graph at the buckets (DDPOptimizer)."""
    if ranks.world_size() == 1:
        return model
    eager = getattr(model, "_orig_mod", model)
    if cfg.train.sync_bn:
        if device.type != "cuda":
            raise ConfigError("train.sync_bn=true: SyncBatchNorm runs on CUDA; on a CPU each "
                              "rank normalises over its own batch (train.sync_bn=false)")
        eager = torch.nn.SyncBatchNorm.convert_sync_batchnorm(eager)  # shares the parameters
    wrapped = ranks.wrap(eager, device)
    if cfg.train.compile == "off":
        return wrapped
    return models.compile_model(wrapped, cfg.train.compile)


def precision(cfg: Config, device: torch.device, bare: torch.nn.Module, data,
              replay: Replay | None) -> amp_probe.AmpDecision:
    """train.amp resolved (auto: measured on a CPU, accel.train.amp_probe), the bf16 conv guard put
    on where a CPU trains in bf16."""
    shape = (cfg.train.batch_size, data.in_chans, data.img_size, data.img_size)
    replayed = replay.amp if replay else None
    if ranks.world_size() > 1 and ranks.rank() > 0:  # several ranks: rank 0 decides for all
        replayed = ranks.from_rank_zero(None)
    amp = amp_probe.decide(cfg.train.amp, device, bare, cfg, shape, data.num_classes, replayed)
    if ranks.world_size() > 1 and ranks.rank() == 0:
        ranks.from_rank_zero(amp.mode)
    if amp.dtype is torch.bfloat16 and device.type == "cpu":
        engine.guard_cpu_bf16_convs(bare)
    return amp


def _held_bias(t, bare: torch.nn.Module, schedule: Schedule | None):
    """The whitening bias, held after train.whiten_bias_epochs (a budgeted run: after its
    share of the plan, `schedule`), or None."""
    whitening = models.whitening_layer(bare)
    if whitening is None or t.whiten_bias_epochs is None:
        return None
    return engine.HeldParameter(whitening.bias, t.whiten_bias_epochs,
                                drop_grad=ranks.world_size() == 1, schedule=schedule)


FEW_UPDATES = 10  # updates per epoch under which a run says so
_said: set[str] = set()


def _once(*notices: str | None) -> list[str]:
    """The notices this process has not said yet (a study's trials would repeat them; None is
    nothing to say)."""
    new = [n for n in notices if n is not None and n not in _said]
    _said.update(new)
    return new


def few_updates(loader, accumulation_steps: int, epoch_length: int) -> str | None:
    """A notice when an epoch is only a few updates (a small data set at the default batch
    size): the schedule and the per-epoch metrics then move in large steps. It says what the
    last partial batch becomes."""
    updates = -(-epoch_length // accumulation_steps)  # a short last window is an update too
    if updates >= FEW_UPDATES:
        return None
    n, b = len(loader.dataset), loader.batch_size
    left = n % b if loader.drop_last else 0
    dropped = (f"; the last {left} image(s) of each shuffled pass are left out (a different "
               "few each epoch), so that every update has a full batch" if left else "")
    return (f"an epoch is {updates} update(s) ({n} training images, train.batch_size={b}"
            + (f", train.accumulation_steps={accumulation_steps}" if accumulation_steps > 1
               else "") + f"){dropped}; a smaller train.batch_size gives more updates")


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seeds python, numpy and torch; deterministic kernels when asked (slower on GPU)."""
    from ignite.utils import manual_seed

    manual_seed(seed)
    if deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; set before the first CUDA call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = True  # pick the fastest conv kernels for fixed shapes

