"""One typed config for a whole run: YAML in, dotted `KEY=VALUE` overrides, validation.

Every setting lives here. The CLI only overrides it, and the resolved config is logged whole
(MLflow params, `config.yaml`), so `accel train config.yaml` reruns a run exactly."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from accel.config_checks import (  # noqa: F401 (the allowed values, and the checks)
    AMP_MODES,
    COST_METRICS,
    DATASETS,
    DEVICES,
    DIRECTIONS,
    METRICS,
    OPTIMIZERS,
    PRUNERS,
    SAMPLERS,
    SCHEDULERS,
    TTA_MODES,
    objectives,
)
from accel.config_checks import check as validate
from accel.config_types import coerce
from accel.errors import ConfigError

DEFAULT_CONFIG = Path("experiments/quickstart.yaml")
SPACE_KEY = "search.space"  # a mapping of dotted keys: flattened into params (config_params)


@dataclass
class DataConfig:
    dataset: str = "digits"
    root: str = "data"  # where cifar10/cifar100/imagefolder files live
    download: bool = False  # torchvision download; needs a network
    val_fraction: float = 0.1  # of the training split, held out with `train.seed`
    num_workers: int = 0
    pin_memory: bool = True  # page-locked batches + non_blocking copies; only with an accelerator
    in_memory: bool = False  # decode an image dataset once and keep it as one uint8 tensor
    # every split as one tensor on the training device, shuffled, cropped, flipped and normalised
    # there per batch (accel.resident); no loader workers: num_workers and pin_memory go unused
    on_device: bool = False
    augment: bool = True  # random crop + flip on image datasets (not digits)
    translate: int | None = None  # the random crop's padding in pixels; None = side // 8
    # what the crop's padding holds: zeros (black), or reflect: the image mirrored at its edges
    # (airbench), so no crop shows a border that test images do not have
    padding: str = "zeros"
    # random: each image mirrored with probability 1/2 in each pass; alternating (airbench, with
    # data.on_device): a random first choice per image, then mirrored in every other pass
    flip: str = "random"
    color_jitter: float = 0.0  # hiverge's brightness/contrast jitter, on device (accel.resident)
    train_limit: int | None = None  # use only the first N training images (quick experiments)
    # score the test split on N of its images (smoke runs, ablations): the same N in every run,
    # drawn with a fixed seed across all classes (a split sorted by class would give one class)
    test_limit: int | None = None


@dataclass
class ModelConfig:
    name: str = "resnet10t"  # any timm model name
    pretrained: bool = False
    img_size: int | None = None  # input side in pixels; None = the dataset's own
    # airbench's partial identity init: each ungrouped odd-kernel convolution starts as the
    # identity on its first min(in, out) channels (the rest keep the model's own init)
    dirac_init: bool = False
    # every BatchNorm layer's momentum in PyTorch's sense (the weight of the new batch in the
    # running statistics: airbench's 0.6 "momentum" is 0.4 here); None = the model's own
    bn_momentum: float | None = None
    # every BatchNorm layer's eps, added to the variance under its square root (airbench's
    # 1e-12); None = the model's own (PyTorch's 1e-5)
    bn_eps: float | None = None
    # airbench's whitened first layer: a fixed k x k patch convolution (k = this, 0 = off) from
    # the eigenvectors of the patches' covariance in the first `whiten_images` training images
    # (computed at build time, so a rerun rebuilds it); 2 C k^2 channels in front of the model
    whiten: int = 0
    whiten_images: int = 5000
    # the whitening layer's bias starts at zero (airbench's Conv) instead of PyTorch's uniform
    # init for a convolution (+-0.29 for the 2x2 layer on RGB)
    whiten_bias_zero: bool = False
    # the logits are the network's output times this (airbench's 1/9: a cooler softmax at the
    # start and a smaller step of the logits for the head's updates); 1 = as the model is
    head_scale: float = 1.0


@dataclass
class TrainConfig:
    epochs: int = 5
    batch_size: int = 64  # images per micro-batch (one forward/backward)
    accumulation_steps: int = 1  # micro-batches per optimizer update
    # auto: bf16 on CUDA (fp16 + loss scaling on older GPUs); on a CPU the faster of bf16 and
    # fp32 for this model and batch, by a probe of a few updates (cached, logged;
    # accel.train.amp_probe)
    amp: str = "auto"
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.05  # not applied to norms and biases (but see bn_bias_decay)
    momentum: float = 0.9  # sgd and nesterov only
    # optimizer=muon (accel.muon), after airbench94_muon: the body's convolution filters and
    # other weight matrices take Muon at muon_lr (the schedule scales it as it scales lr), with
    # Nesterov momentum muon_momentum and muon_ns_steps Newton-Schulz iterations in
    # muon_ns_dtype (bf16 or fp32), each weight scaled to a norm of sqrt(out channels) before
    # its step (muon_renorm); norms, biases and the classifier head take muon_rest (adam,
    # adamw, sgd, nesterov) at lr, momentum and weight_decay above
    muon_lr: float = 0.24
    muon_momentum: float = 0.6
    muon_ns_steps: int = 3
    muon_ns_dtype: str = "bf16"
    muon_renorm: bool = True
    muon_rest: str = "nesterov"
    clip_grad_norm: float | None = None  # max global L2 norm of the gradients; None = off
    scheduler: str = "cosine"
    warmup_epochs: float = 0.0
    # the learning rate as a fraction of train.lr where the warm-up starts and where the decay
    # ends (airbench's triangle: 0.2 and 0.07, with the peak at 23% of training); 0 = from and to 0
    lr_start: float = 0.0
    lr_end: float = 0.0
    label_smoothing: float = 0.0
    # BatchNorm (airbench): the biases' learning rate is train.lr times this (no weight decay,
    # as for every norm and bias); frozen weights stay 1 (the scale is left to the next conv)
    bn_bias_lr_scale: float = 1.0
    bn_weight_frozen: bool = False
    # the BatchNorm biases and the whitening bias decay as much per update as the weights do
    # (airbench); False: they take no weight decay, as every norm and bias
    bn_bias_decay: bool = False
    # the whitening bias's learning rate is train.lr times this (airbench: 1); None: it trains
    # with the BatchNorm biases, at bn_bias_lr_scale
    whiten_bias_lr_scale: float | None = None
    # an exponential moving average of the weights (and BatchNorm statistics), updated after
    # every optimizer update with this decay (torch.optim.swa_utils): what is evaluated, kept as
    # the best epoch's weights and logged as the model; None = off
    ema_decay: float | None = None
    # airbench's Lookahead: every lookahead_every updates the average of the weights (BatchNorm
    # statistics too) moves toward them by 1 - decay^every x (update / total)^3 and is written
    # back into them; the last update leaves the network on the average. None = off
    lookahead_decay: float | None = None
    lookahead_every: int = 5
    # model.whiten's bias trains this many epochs, then stays (None: throughout)
    whiten_bias_epochs: int | None = None
    seed: int = 0
    device: str = "auto"
    channels_last: bool = False
    # CPU (glibc): memory freed by tensors is kept for the next ones instead of handed back to
    # the kernel, which saves a page fault per 4 KiB of activations each step (README)
    keep_freed_memory: bool = True
    # torch.compile: off, default, reduce-overhead (CUDA graphs: fewer launches, on CUDA) or
    # max-autotune (kernels chosen by timing, minutes of compiling); true = default, false = off
    compile: str = "off"
    deterministic: bool = False
    # TF32 for CUDA matmuls and cuDNN convolutions (fp32 range, 10-bit mantissa: several times
    # fp32's tensor-core throughput on Ampere and later, precision training tolerates; PyTorch's
    # own defaults set cuDNN's on and matmul's off). Recorded in environment.json. No effect
    # on a CPU, nor under bf16/fp16 autocast for the ops autocast lowers
    tf32: bool = True
    epoch_length: int | None = None  # micro-batches per epoch; None = the whole training set
    # seconds of training (evaluation excluded): the schedule, laid over `epochs` above, is
    # stretched or shrunk to the updates that fit, measured as the run goes (accel.train.budget)
    budget_s: float | None = None
    # {metric, value}: log time_to_target_s and epochs_to_target at the first epoch reaching it
    target: dict[str, Any] = field(default_factory=dict)
    stop_at_target: bool = False  # end the run (FINISHED) at that epoch
    nproc_per_node: int = 1  # processes training the run data parallel; batch_size is each's
    # several ranks: BatchNorm over every rank's images of a step (SyncBatchNorm, CUDA), not
    # over each rank's batch_size alone (the default, which then normalises over 1/N as many)
    sync_bn: bool = False

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.accumulation_steps * self.nproc_per_node


@dataclass
class EvalConfig:
    # test-time augmentation of every evaluation (val and test): flip = the mean of the logits of
    # each image and its mirror image; multicrop = airbench's: 1/2 of the flip mean of the image,
    # 1/4 each of the flip means of the image moved 1 px up-left and 1 px down-right
    tta: str = "none"
    # false: every epoch's validation without TTA (one forward pass an image, not up to 6), TTA
    # for the run's final scores only (test_*, the confusion matrix), as airbench scores
    tta_every_epoch: bool = True


@dataclass
class SearchConfig:
    metric: str = "val_accuracy"
    direction: str = "maximize"
    n_trials: int = 10
    sampler: str = "tpe"
    pruner: str = "median"
    space: dict[str, Any] = field(default_factory=dict)
    # Two or more {metric, direction}: a multi-objective study (Pareto front); metric and
    # direction above then only choose the epoch whose weights best.pt keeps.
    objectives: list[dict[str, str]] = field(default_factory=list)
    enqueue: list[dict[str, Any]] = field(default_factory=list)  # partial configs tried first


@dataclass
class TrackingConfig:
    uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db
    experiment: str | None = None  # None: the config's name
    log_checkpoint: bool = True  # best.pt, and the last-epoch checkpoint `accel resume` needs
    system_metrics: bool = True  # MLflow system metrics (CPU, memory; GPU through NVML)
    log_model: bool = False  # the best epoch's weights as an MLflow PyTorch model in the run
    # confusion_matrix.png and time_split.png at the run's end: about a second of drawing, and
    # matplotlib's import in a fresh process, which a trial of seconds may rather not pay
    figures: bool = True


@dataclass
class Config:
    name: str = "quickstart"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        # What `load` adapted and says once the run has its data (accel.train.parts.build): bad
        # input found before is then the only line a failed command prints. Not a field: never
        # logged, never compared.
        self.notes: list[str] = []

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def flat(self) -> dict[str, Any]:
        """The whole config as `{"train.lr": 0.001, ...}`; nested dicts are flattened too."""
        return flatten(self.to_dict())


def param_text(value: Any) -> str:
    """How a config value is logged as an MLflow param (`from_params` reads it back)."""
    return "null" if value is None else str(value)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# --- building a Config from plain data -------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for name, tp in _hints(cls).items():
        if dataclasses.is_dataclass(tp):
            keys += _keys(tp, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def all_keys() -> list[str]:
    return _keys(Config)


def _unknown_key(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, all_keys(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `accel train --help` for keys"
    return ConfigError(f"unknown config key '{key}'{hint}")


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = _hints(cls)
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in hints:
            raise _unknown_key(dotted)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise ConfigError(f"{dotted}: expected a section of keys, got {value!r}")
            kwargs[key] = _build(tp, value, f"{dotted}.")
        else:
            kwargs[key] = coerce(dotted, value, tp)
    return cls(**kwargs)


def from_dict(data: dict[str, Any]) -> Config:
    cfg = _build(Config, data)
    validate(cfg)
    if cfg.train.deterministic:  # before the process's first cuBLAS call, which fixes it
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return cfg


def set_key(cfg: Config, key: str, value: Any) -> None:
    """Set one dotted key in place, coercing `value` (often a string) to the field's type."""
    *sections, leaf = key.split(".")
    node: Any = cfg
    for section in sections:
        if not dataclasses.is_dataclass(node) or section not in _hints(type(node)):
            raise _unknown_key(key)
        node = getattr(node, section)
    hints = _hints(type(node)) if dataclasses.is_dataclass(node) else {}
    if leaf not in hints or dataclasses.is_dataclass(hints[leaf]):
        raise _unknown_key(key)
    setattr(node, leaf, coerce(key, value, hints[leaf]))


def parse_override(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or " " in key.strip():
        raise ConfigError(f"malformed override '{text}': expected KEY=VALUE, e.g. train.lr=3e-3")
    return key.strip(), value


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML experiment file (or the defaults), apply `KEY=VALUE` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config file '{path}': {e.strerror or e}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config file '{path}' is not valid YAML{where}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file '{path}' must hold a mapping of sections")
    cfg = _build(Config, data)
    if path is not None and "name" not in data:
        cfg.name = Path(path).stem
    data_before, keys = (cfg.data.dataset, cfg.data.root), set()
    for item in overrides:
        key, value = parse_override(item)
        set_key(cfg, key, value)
        keys.add(key)
    if (cfg.data.dataset, cfg.data.root) != data_before:
        follow_the_data(cfg, data_before[0], keys, path)
        name_for_the_data(cfg, data_before, keys, path)
    validate(cfg)
    if cfg.train.deterministic:  # before the process's first cuBLAS call, which fixes it
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return cfg


def data_label(dataset: str, root: str) -> str:
    """A short name for a dataset: the folder's name for an imagefolder, else the dataset's."""
    label = Path(root).expanduser().name if dataset == "imagefolder" else dataset
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-") or dataset


def name_for_the_data(cfg: Config, before: tuple[str, str], keys: set[str], path) -> None:
    """The command line put a file's experiment on other data: its runs (and its study) go
    under their own name, `<name>-<data>`, not among the file's runs on the file's data, unless
    the command line names them. A root moved elsewhere with the same folder name is the same
    data."""
    if keys & {"name", "tracking.experiment"} or cfg.tracking.experiment:
        return
    old, new = data_label(*before), data_label(cfg.data.dataset, cfg.data.root)
    if new == old:
        return
    source = Path(path).name if path else "the defaults"
    cfg.name = f"{cfg.name}-{new}"
    cfg.notes.append(f"data.dataset={cfg.data.dataset} data.root={cfg.data.root} is not the data "
                     f"of {source}: runs and studies go under the name {cfg.name} (set "
                     "name=NAME to choose one)")


def follow_the_data(cfg: Config, dataset_before: str, keys: set[str], path) -> None:
    """The command line changed the data: a file's `model.img_size`, set for its own data,
    gives way to the new data's own size unless the command line sets it too (one line says so)."""
    if cfg.model.img_size is None or "model.img_size" in keys:
        return
    cfg.notes.append(f"model.img_size={cfg.model.img_size} from {path} was set for "
                     f"data.dataset={dataset_before}; the new data's own image size is used (set "
                     "model.img_size=N to choose one)")
    cfg.model.img_size = None
