"""Which runs an ablation makes: every on/off combination of the chosen techniques, what each
switch means on this device for this config, and the order the runs go in.

- `ga`  the config's effective batch (`train.batch_size` x `train.accumulation_steps`) comes from
        `train.accumulation_steps` smaller micro-batches (4 when the config says 1); off, it is
        one micro-batch of the full effective size.
- `amp` autocast in bf16 where the device supports it, else fp16 with a GradScaler.
- `pm`  page-locked DataLoader batches + `non_blocking` copies. It only changes anything with an
        accelerator, so on CPU those combinations are reported "n/a on cpu" and not run.
- `resident`  `data.on_device=true`: the whole split as one tensor on the device, augmented a batch
        at a time there (accel.resident); off, the config's DataLoader. On CPU it means "decoded
        in memory, augmented in batches" (no copy to save), and the header says so; with it on,
        `pm` has no copies to speed, so those combinations are n/a.
- `channels_last`, `compile`  the memory-format and `torch.compile` switches.
- `ddp` the effective batch shared out over every GPU of the machine, one rank each
        (`train.nproc_per_node`, accel.train.launch); off, one GPU. With fewer than two GPUs
        its combinations are n/a, with a line that says so.

Within a repeat every combination trains with the same data, seed, epochs and effective batch
size; each repeat has a seed of its own (repeat r: `train.seed` + r - 1), so the accuracy
differences between combinations carry real seed-to-seed variation, and are paired by repeat.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass

from accel.config import Config
from accel.errors import ConfigError

TECHNIQUES = ("ga", "amp", "pm", "resident", "channels_last", "compile", "ddp")
DEFAULT_GA_STEPS = 4  # micro-batches per update for `ga` when the config itself does not use GA
BASELINE = "baseline"


def parse_techniques(text: str) -> tuple[str, ...]:
    """'ga,amp,pm' -> ('ga', 'amp', 'pm'), in the order given; unknown or repeated names fail."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not names:
        raise ConfigError(f"--techniques is empty: choose from {', '.join(TECHNIQUES)}")
    for name in names:
        if name not in TECHNIQUES:
            raise ConfigError(f"--techniques: unknown '{name}'; "
                              f"choose from {', '.join(TECHNIQUES)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--techniques lists a technique twice: {text!r}")
    return tuple(names)


@dataclass(frozen=True)
class Combination:
    techniques: tuple[str, ...]  # all the ablated techniques, in the user's order
    on: frozenset[str]  # the ones switched on here

    @property
    def name(self) -> str:
        return "+".join(t for t in self.techniques if t in self.on) or BASELINE

    @property
    def key(self) -> str:
        """The name as an MLflow metric key (they cannot hold '+')."""
        return self.name.replace("+", "-")

    def without(self, technique: str) -> Combination:
        return Combination(self.techniques, self.on - {technique})


def combinations(techniques: tuple[str, ...]) -> list[Combination]:
    """All 2^k on/off sets: the all-off baseline first, then by how many are on."""
    out = []
    for flags in itertools.product((False, True), repeat=len(techniques)):
        on = frozenset(t for t, f in zip(techniques, flags, strict=True) if f)
        out.append(Combination(techniques, on))
    order = {t: i for i, t in enumerate(techniques)}
    return sorted(out, key=lambda c: (len(c.on), sorted(order[t] for t in c.on)))


@dataclass
class AblationPlan:
    """What each technique means on this device, for this config."""

    techniques: tuple[str, ...]
    device: str  # "cpu" or "cuda"
    effective_batch: int  # images per optimizer update, the same in every combination
    ga_steps: int  # micro-batches per update when `ga` is on
    updates_per_epoch: int | None  # None: the whole training set every epoch
    amp: str  # the autocast dtype of `amp` on: "bf16" or "fp16"
    target: dict  # train.target ({metric, value}) or {}: the table adds time to target
    ranks: int = 1  # processes of `ddp` on: the machine's GPUs (1: ddp is n/a here)

    def micro_batch(self, ga: bool) -> int:
        return self.effective_batch // self.ga_steps if ga else self.effective_batch


def make_plan(cfg: Config, techniques: tuple[str, ...], device) -> AblationPlan:
    t = cfg.train
    effective = t.batch_size * t.accumulation_steps
    ga_steps = t.accumulation_steps if t.accumulation_steps > 1 else DEFAULT_GA_STEPS
    if "ga" in techniques and effective % ga_steps:
        raise ConfigError(
            f"ga: effective batch {effective} (train.batch_size x train.accumulation_steps) "
            f"does not split into {ga_steps} equal micro-batches; pick sizes that divide"
        )
    ranks = gpus(device) if "ddp" in techniques else 1
    micro = {effective, effective // ga_steps} if "ga" in techniques else {t.batch_size}
    if any(m % ranks for m in micro):
        raise ConfigError(f"ddp: micro-batch {' or '.join(map(str, sorted(micro)))} does not "
                          f"split into {ranks} ranks; pick sizes that divide")
    updates = None
    if t.epoch_length is not None:  # epoch_length counts the config's own micro-batches
        updates = math.ceil(t.epoch_length / t.accumulation_steps)
    amp = amp_dtype(t.amp, device) if "amp" in techniques else t.amp
    return AblationPlan(techniques, device.type, effective, ga_steps, updates, amp,
                        dict(t.target), ranks)


def gpus(device) -> int:
    """The GPUs `ddp` on trains with: all the machine's, on a CUDA run; one on a CPU run."""
    import torch

    return torch.cuda.device_count() if device.type == "cuda" else 1


def amp_dtype(mode: str, device) -> str:
    """`amp` on: the config's explicit bf16/fp16, else bf16 where supported, else fp16 (+scaler)."""
    if mode in ("bf16", "fp16"):
        return mode
    if device.type == "cuda":

        from accel.engine import native_bf16

        return "bf16" if native_bf16() else "fp16"
    # CPU: bf16 autocast (AMX / avx512_bf16 where the CPU has them). Unlike `train.amp=auto`,
    # which stays fp32 on CPU (engine.resolve_amp): ablating amp measures what train.amp=bf16
    # gives, and the report's header says so.
    return "bf16"


def not_applicable(combo: Combination, plan: AblationPlan) -> str | None:
    """Why this combination cannot differ from another one here, or None when it can."""
    if "pm" in combo.on and plan.device != "cuda":
        return (f"n/a on {plan.device}: pinned memory only speeds host-to-accelerator copies "
                f"(same run as {combo.without('pm').name})")
    if "ddp" in combo.on and plan.ranks < 2:
        where = "one GPU" if plan.device == "cuda" else plan.device
        return (f"n/a on {where}: ddp needs two or more GPUs "
                f"(same run as {combo.without('ddp').name})")
    if "pm" in combo.on and "resident" in combo.on:
        return (f"n/a: resident data makes no host-to-device copies "
                f"(same run as {combo.without('pm').name})")
    return None


def combination_config(base: Config, combo: Combination, plan: AblationPlan) -> Config:
    """`base` with the ablated switches set for `combo`; everything else stays as configured."""
    cfg = copy.deepcopy(base)
    t, d, chosen = cfg.train, cfg.data, plan.techniques
    if "ga" in chosen:
        ga = "ga" in combo.on
        t.batch_size = plan.micro_batch(ga)
        t.accumulation_steps = plan.ga_steps if ga else 1
        if plan.updates_per_epoch is not None:  # the same images per epoch either way
            t.epoch_length = plan.updates_per_epoch * t.accumulation_steps
    if "ddp" in combo.on:  # the same micro-batch, shared out: every update sees the same images
        t.batch_size //= plan.ranks
        t.nproc_per_node = plan.ranks
    if "amp" in chosen:
        t.amp = plan.amp if "amp" in combo.on else "off"
    if "pm" in chosen:
        d.pin_memory = "pm" in combo.on
    if "resident" in chosen:
        d.on_device = "resident" in combo.on
    if "channels_last" in chosen:
        t.channels_last = "channels_last" in combo.on
    if "compile" in chosen:
        t.compile = "default" if "compile" in combo.on else "off"
    cfg.tracking.log_checkpoint = False  # 2^k x R weight files would measure nothing
    cfg.tracking.system_metrics = False  # a sampling thread would share the cores it times
    return cfg


def repeat_seed(base: Config, repeat: int) -> int:
    """The seed of repeat `repeat` (0-based), the same for every combination."""
    return base.train.seed + repeat


def schedule(combos: list[Combination], repeats: int) -> list[tuple[int, Combination]]:
    """Repeat-major, every other repeat reversed: a slow drift of the machine (heat, a
    neighbour's job) lands on all combinations alike instead of on the last ones."""
    order = []
    for r in range(repeats):
        order += [(r, c) for c in (combos if r % 2 == 0 else combos[::-1])]
    return order
