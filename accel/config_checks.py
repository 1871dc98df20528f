"""The rules a config must keep (`accel.config.validate`): each value checked against what the
code can run, one line naming the key, the value and what is allowed."""

from __future__ import annotations

from typing import Any

from accel.errors import ConfigError

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder")
AMP_MODES = ("off", "auto", "bf16", "fp16")
MUON_REST = ("adam", "adamw", "sgd", "nesterov")  # what takes the parameters Muon does not
OPTIMIZERS = (*MUON_REST, "muon")
MUON_NS_DTYPES = ("bf16", "fp32")  # the precision of Muon's Newton-Schulz iterations
SCHEDULERS = ("cosine", "linear", "constant")
TTA_MODES = ("none", "flip", "multicrop")
FLIPS = ("random", "alternating")
PADDINGS = ("zeros", "reflect")
DEVICES = ("auto", "cpu", "cuda")
METRICS = ("val_accuracy", "val_loss", "val_f1")  # what the evaluator reports after every epoch
# A run's costs, for multi-objective studies: total training seconds (evaluation excluded),
# mean images per second, peak memory (MB).
COST_METRICS = ("train_time_s", "train_throughput", "peak_memory_mb")
DIRECTIONS = ("maximize", "minimize")
SAMPLERS = ("tpe", "random", "nsga2")
PRUNERS = ("median", "hyperband", "none")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")  # torch.compile(mode=...)
_COMPILE_WORDS = {"true": "default", "yes": "default", "on": "default", "1": "default",
                  "false": "off", "no": "off", "0": "off"}  # the switch it was: still accepted


def objectives(s: Any) -> list[tuple[str, str]]:
    """The study's (metric, direction) pairs: `search.objectives`, else the one metric."""
    return [(o["metric"], o["direction"]) for o in s.objectives] or [(s.metric, s.direction)]


def _check_objectives(s: Any) -> None:
    if not s.objectives:
        return
    if not isinstance(s.objectives, list) or len(s.objectives) < 2:
        raise ConfigError(f"search.objectives={s.objectives!r}: list two or more "
                          "{metric, direction}; for one, use search.metric and search.direction")
    for i, o in enumerate(s.objectives):
        where = f"search.objectives[{i}]"
        if not isinstance(o, dict) or set(o) != {"metric", "direction"}:
            raise ConfigError(f"{where}={o!r}: expected {{metric: ..., direction: ...}}")
        _choice(f"{where}.metric", o["metric"], METRICS + COST_METRICS)
        _choice(f"{where}.direction", o["direction"], DIRECTIONS)
    names = [o["metric"] for o in s.objectives]
    if len(set(names)) != len(names):
        raise ConfigError(f"search.objectives: a metric is listed twice ({', '.join(names)})")
    if s.pruner != "none":
        raise ConfigError(f"search.pruner={s.pruner}: Optuna prunes single-objective studies "
                          f"only; with {len(names)} objectives set search.pruner=none")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(choices)}")


def _require(key: str, value: Any, ok: bool, rule: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value}: {rule}")


def check(cfg: Any) -> None:
    """Reject values that would fail later, with the key, the value and what is allowed."""
    d, m, t, s = cfg.data, cfg.model, cfg.train, cfg.search
    _check_data(d)
    if not m.name:
        raise ConfigError("model.name is empty: give a timm model name, e.g. resnet18")
    _require("model.img_size", m.img_size, m.img_size is None or m.img_size >= 1,
             "must be >= 1 or null")
    _require("train.epochs", t.epochs, t.epochs >= 1, "must be >= 1")
    _require("train.batch_size", t.batch_size, t.batch_size >= 1, "must be >= 1")
    _require("train.accumulation_steps", t.accumulation_steps, t.accumulation_steps >= 1,
             "must be >= 1")
    _require("train.lr", t.lr, t.lr > 0, "must be > 0")
    _require("train.weight_decay", t.weight_decay, t.weight_decay >= 0, "must be >= 0")
    _require("train.clip_grad_norm", t.clip_grad_norm,
             t.clip_grad_norm is None or t.clip_grad_norm > 0, "must be > 0 or null (off)")
    _require("train.warmup_epochs", t.warmup_epochs, t.warmup_epochs >= 0, "must be >= 0")
    for key, value in (("train.lr_start", t.lr_start), ("train.lr_end", t.lr_end)):
        _require(key, value, 0 <= value <= 1, "must be in [0, 1] (a fraction of train.lr)")
    _require("model.head_scale", m.head_scale, m.head_scale > 0, "must be > 0 (1 = off)")
    _require("train.label_smoothing", t.label_smoothing, 0 <= t.label_smoothing < 1,
             "must be in [0, 1)")
    _require("train.bn_bias_lr_scale", t.bn_bias_lr_scale, t.bn_bias_lr_scale > 0,
             "must be > 0")
    _require("model.whiten", m.whiten, m.whiten >= 0, "must be >= 0 (0 = off)")
    if m.whiten and d.dataset != "digits" and not (d.in_memory or d.on_device):
        raise ConfigError(f"model.whiten={m.whiten} reads the training images from memory: set "
                          "data.in_memory=true or data.on_device=true")
    _require("model.whiten_images", m.whiten_images, m.whiten_images >= 1, "must be >= 1")
    _require("train.whiten_bias_epochs", t.whiten_bias_epochs,
             t.whiten_bias_epochs is None or t.whiten_bias_epochs >= 0, "must be >= 0 or null")
    _require("train.ema_decay", t.ema_decay, t.ema_decay is None or 0 < t.ema_decay < 1,
             "must be in (0, 1), or null for off")
    _require("model.bn_momentum", cfg.model.bn_momentum,
             cfg.model.bn_momentum is None or 0 < cfg.model.bn_momentum <= 1,
             "must be in (0, 1] or null (the model's own)")
    _require("train.nproc_per_node", t.nproc_per_node, t.nproc_per_node >= 1, "must be >= 1")
    _check_budget(t)
    _check_muon(t)
    _check_parity(m, t)
    _require("train.epoch_length", t.epoch_length, t.epoch_length is None or t.epoch_length >= 1,
             "must be >= 1 or null")
    for key, value, choices in (
        ("train.amp", t.amp, AMP_MODES), ("train.optimizer", t.optimizer, OPTIMIZERS),
        ("train.scheduler", t.scheduler, SCHEDULERS), ("train.device", t.device, DEVICES),
        ("search.metric", s.metric, METRICS), ("search.direction", s.direction, DIRECTIONS),
        ("search.sampler", s.sampler, SAMPLERS), ("search.pruner", s.pruner, PRUNERS),
        ("eval.tta", cfg.eval.tta, TTA_MODES), ("train.compile", _compile_mode(t), COMPILE_MODES),
        ("data.flip", d.flip, FLIPS), ("data.padding", d.padding, PADDINGS),
    ):
        _choice(key, value, choices)
    _check_objectives(s)
    _check_target(t)


def _check_data(d: Any) -> None:
    _choice("data.dataset", d.dataset, DATASETS)
    _require("data.val_fraction", d.val_fraction, 0 <= d.val_fraction < 1, "must be in [0, 1)")
    _require("data.num_workers", d.num_workers, d.num_workers >= 0, "must be >= 0")
    for key, limit in (("data.train_limit", d.train_limit), ("data.test_limit", d.test_limit)):
        _require(key, limit, limit is None or limit >= 1, "must be >= 1 or null")
    _require("data.translate", d.translate, d.translate is None or d.translate >= 0,
             "must be >= 0 or null (side // 8)")
    if d.flip == "alternating" and not d.on_device:
        raise ConfigError("data.flip=alternating is drawn by the resident loader: set "
                          "data.on_device=true")
    _require("data.color_jitter", d.color_jitter, 0 <= d.color_jitter < 1, "must be in [0, 1)")
    if d.color_jitter and not d.on_device:
        raise ConfigError(f"data.color_jitter={d.color_jitter} is drawn by the resident loader: "
                          "set data.on_device=true")


def _compile_mode(t: Any) -> Any:
    """train.compile with the switch it once was read as a mode: true = default, false = off."""
    t.compile = _COMPILE_WORDS.get(str(t.compile).strip().lower(), t.compile)
    return t.compile


def _check_budget(t: Any) -> None:
    if t.budget_s is None:
        return
    _require("train.budget_s", t.budget_s, t.budget_s > 0,
             "must be > 0 (seconds of training) or null (train.epochs)")
    _require("train.budget_s", t.budget_s, t.nproc_per_node == 1,
             "is measured by one process: set train.nproc_per_node=1 or train.budget_s=null")


def _check_muon(t: Any) -> None:
    _require("train.muon_lr", t.muon_lr, t.muon_lr > 0, "must be > 0")
    _require("train.muon_momentum", t.muon_momentum, 0 <= t.muon_momentum < 1,
             "must be in [0, 1)")
    _require("train.muon_ns_steps", t.muon_ns_steps, t.muon_ns_steps >= 1, "must be >= 1")
    _choice("train.muon_rest", t.muon_rest, MUON_REST)
    _choice("train.muon_ns_dtype", t.muon_ns_dtype, MUON_NS_DTYPES)


def _check_parity(m: Any, t: Any) -> None:
    """The keys that set the fast recipe to airbench94's own arithmetic."""
    _require("model.bn_eps", m.bn_eps, m.bn_eps is None or m.bn_eps > 0,
             "must be > 0 or null (the model's own)")
    _require("train.whiten_bias_lr_scale", t.whiten_bias_lr_scale,
             t.whiten_bias_lr_scale is None or t.whiten_bias_lr_scale > 0,
             "must be > 0 or null (train.bn_bias_lr_scale)")
    _require("train.lookahead_decay", t.lookahead_decay,
             t.lookahead_decay is None or 0 < t.lookahead_decay < 1,
             "must be in (0, 1), or null for off")
    _require("train.lookahead_every", t.lookahead_every, t.lookahead_every >= 1,
             "must be >= 1 (updates between write-backs)")
    if t.lookahead_decay is not None and t.ema_decay is not None:
        raise ConfigError(f"train.lookahead_decay={t.lookahead_decay} and train.ema_decay="
                          f"{t.ema_decay}: choose one (the Lookahead's average is written into "
                          "the network, which is then what is scored); set the other to null")


def _check_target(t: Any) -> None:
    if t.stop_at_target and not t.target:
        raise ConfigError("train.stop_at_target=true needs train.target: {metric: ..., value: ...}")
    if not t.target:
        return
    if set(t.target) != {"metric", "value"}:
        raise ConfigError(f"train.target={t.target!r}: expected {{metric: val_accuracy, "
                          "value: 0.9}")
    _choice("train.target.metric", t.target["metric"], METRICS)
    value = t.target["value"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"train.target.value={value!r}: expected a number")
