"""Datasets and DataLoaders: digits, cifar10, cifar100, imagefolder.

Image datasets go through torchvision transforms v2; training batches come from pinned memory when
an accelerator is used, so the host-to-device copy can run with `non_blocking=True`.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from accel import decoded, ranks, shared_data
from accel.config import Config, ConfigError

# Per-channel statistics of the training sets, in [0, 1] pixel units.
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
GRAY_MEAN, GRAY_STD = (0.449,), (0.226,)  # ImageNet's, averaged over the channels (as timm)
GRAY_MODES = ("1", "L", "LA", "I", "I;16", "F")  # PIL modes read as one channel
DIGITS_MEAN, DIGITS_STD = (0.3,), (0.4,)  # sklearn digits scaled from 0..16 to 0..1
DIGITS_SIDE = 8
CIFAR_SIDE = 32


class DataError(ConfigError):
    """Missing or unusable data: exit 2 with a line that says how to get it."""


@dataclass
class Data:
    train: DataLoader | None  # None: evaluation of one split (build_eval_data)
    val: DataLoader | None
    test: DataLoader | None
    num_classes: int
    in_chans: int
    img_size: int
    classes: list[str]

    def close(self) -> None:
        """Stop the loaders' worker processes now (persistent ones live as long as their
        loader). Left to the garbage collector, a loader caught in a reference cycle (the
        trainer's handlers hold one) can be finalized after its own index queues; each worker
        then never hears that it may stop, and torch waits out its 5 s join timeout per worker:
        two minutes per run with 8 workers on three loaders."""
        for loader in (self.train, self.val, self.test):
            running = getattr(loader, "_iterator", None)
            if running is not None and hasattr(running, "_shutdown_workers"):
                running._shutdown_workers()
                loader._iterator = None


def seed_worker(worker_id: int) -> None:
    """Give each DataLoader worker its own numpy/random seed, derived from torch's."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def sample_indices(n: int, k: int) -> list[int]:
    """`k` of `n` indices (all where k >= n), drawn with a fixed seed and sorted: the same
    images in every run whatever its `train.seed`, spread over a split stored class by class."""
    if k >= n:
        return list(range(n))
    return sorted(torch.randperm(n, generator=torch.Generator().manual_seed(0))[:k].tolist())


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A seeded train/val split of `range(n)`: the same seed always holds out the same images."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = round(n * val_fraction)
    return order[n_val:], order[:n_val]


def _transforms(train: bool, size: int, native: int, mean, std, augment: bool, pad: int,
                padding: str = "zeros"):
    from torchvision.transforms import v2

    steps = [v2.ToImage()]
    if size != native:
        steps.append(v2.Resize((size, size), antialias=True))
    if train and augment:
        mode = "reflect" if padding == "reflect" else "constant"
        steps += [v2.RandomCrop(size, padding=pad, padding_mode=mode), v2.RandomHorizontalFlip()]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
    return v2.Compose(steps)


class TensorImages(Dataset):
    """Decoded uint8 images held in memory ([N, C, H, W]) with a per-sample transform. The
    transform's parts are kept too (side, normalisation, crop padding: 0 = no augmentation), for
    `accel.resident`, which applies them a batch at a time on the device. `source` is the
    dataset the images were decoded from (its files or arrays: accel.tracking.lineage)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform, *, size: int,
                 mean, std, pad: int, source=None):
        self.images, self.labels, self.transform = images, labels, transform
        self.size, self.mean, self.std, self.pad = size, mean, std, pad
        self.source = source

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), int(self.labels[i])


@functools.lru_cache(maxsize=4)
def _decode_all(kind: str, root: str, split: str, mode: str = "RGB"):
    """Decode a split once per process ([N, C, H, W] uint8, labels, the dataset decoded);
    ablations and studies reuse it."""
    ds = _raw_dataset(kind, root, split, transform=None, mode=mode)
    if hasattr(ds, "data"):  # CIFAR ships a decoded uint8 array [N, H, W, C]
        images = torch.from_numpy(ds.data)
    else:  # image files: decoded once per machine (accel.decoded)
        def decode() -> np.ndarray:
            frames = [np.atleast_3d(np.array(ds.loader(path))) for path, _ in ds.samples]
            if len({img.shape for img in frames}) > 1:
                raise DataError(
                    f"data.in_memory=true needs images of one size; {root}/{split} mixes sizes")
            return np.stack(frames)  # N, H, W, C

        images = torch.from_numpy(decoded.load_or_decode(ds.samples, mode, decode))
    return images.permute(0, 3, 1, 2).contiguous(), torch.tensor(ds.targets), ds


def _raw_dataset(kind: str, root: str, split: str, transform, download: bool = False,
                 mode: str = "RGB"):
    from torchvision import datasets

    if kind in ("cifar10", "cifar100"):
        cls = datasets.CIFAR10 if kind == "cifar10" else datasets.CIFAR100
        try:
            return cls(root, train=split == "train", transform=transform, download=download)
        except RuntimeError:
            folder = "cifar-10-batches-py" if kind == "cifar10" else "cifar-100-python"
            raise DataError(
                f"data.root={root!r} has no {kind} ({folder}/ not found): set data.download=true "
                f"on a machine with a network, or copy the python-version archive there"
                + (shared_data.jpeg_copy_hint() if kind == "cifar10" else "")
            ) from None
    return datasets.ImageFolder(str(Path(root) / split), transform=transform,
                                loader=functools.partial(load_image, mode=mode))


def load_image(path: str, mode: str = "RGB"):
    """torchvision's default loader (PIL, converted to `mode`), naming the file that is not a
    readable image (truncated, empty, or not an image at all)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with open(path, "rb") as f:
            return Image.open(f).convert(mode)
    except UnidentifiedImageError:
        raise DataError(f"{path}: not an image file PIL can read; remove or replace it") from None
    except OSError as e:  # a truncated file, an unreadable one
        raise DataError(f"{path}: not a readable image ({e}); remove or replace it") from None


def _image_splits(cfg: Config, size_default: int):
    """(train, val, test or None, classes, in_chans, native side) for the image datasets."""
    d = cfg.data
    kind, root = d.dataset, str(Path(d.root).expanduser())  # data.root: ~/.cache/... works
    if kind == "imagefolder":
        if not (Path(root) / "train").is_dir():
            raise DataError(
                f"data.root={root!r} has no train/ folder: an imagefolder dataset needs "
                f"root/train/<class>/*.jpg (and optionally root/val, root/test)"
                + shared_data.shared_data_hint(root))
        has_val = (Path(root) / "val").is_dir()
        has_test = (Path(root) / "test").is_dir()
    else:
        if d.download:
            _raw_dataset(kind, root, "train", None, download=True)
            _raw_dataset(kind, root, "test", None, download=True)
        has_val, has_test = False, True

    probe = _raw_dataset(kind, root, "train", transform=None)
    classes = list(probe.classes)
    native, mode = size_default, "RGB"
    if kind == "imagefolder":  # its own size and channels, read off the first image
        native, mode = _first_image(probe)
    mean, std = normalisation(kind, len(mode))
    size = cfg.model.img_size or native

    translate = d.translate if d.translate is not None else size // 8

    def build(split: str, train: bool):
        tf = _transforms(train, size, native, mean, std, d.augment, translate, d.padding)
        if d.in_memory or d.on_device:
            images, labels, source = _decode_all(kind, root, split, mode)
            pad = translate if train and d.augment else 0
            return TensorImages(images, labels, tf, size=size, mean=mean, std=std, pad=pad,
                                source=source)
        return _raw_dataset(kind, root, split, transform=tf, mode=mode)

    if has_val:
        train_ds, val_ds = build("train", True), build("val", False)
        train_idx = list(range(len(train_ds)))
    else:
        if d.val_fraction <= 0:
            raise DataError(f"data.val_fraction=0 but data.root={root!r} has no val split")
        train_idx, val_idx = split_indices(len(probe), d.val_fraction, cfg.train.seed)
        train_ds = build("train", True)
        val_ds = Subset(build("train", False), val_idx)
    if d.train_limit:
        train_idx = train_idx[: d.train_limit]
    train_ds = Subset(train_ds, train_idx)
    test_ds = build("test", False) if has_test else None
    return train_ds, val_ds, test_ds, classes, len(mode), size


def normalisation(kind: str, in_chans: int) -> tuple[tuple, tuple]:
    """(mean, std) in [0, 1] pixel units that a dataset's images are normalised with."""
    if kind == "digits":
        return DIGITS_MEAN, DIGITS_STD
    if kind in ("cifar10", "cifar100"):
        return (CIFAR10_MEAN, CIFAR10_STD) if kind == "cifar10" else (CIFAR100_MEAN, CIFAR100_STD)
    return (GRAY_MEAN, GRAY_STD) if in_chans == 1 else (IMAGENET_MEAN, IMAGENET_STD)


def to_unit_range(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Normalised [N, C, H, W] batches of dataset `kind` back to [0, 1] images: what a served
    model (accel.tracking.model.served) takes."""
    mean, std = normalisation(kind, x.shape[1])
    return x * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1)


EVAL_SPLITS = ("test", "val", "train")  # what `accel evaluate --split` picks from


def build_eval_data(cfg: Config, device: torch.device, size: int | None = None,
                    split: str | None = None) -> Data:
    """The one split `accel evaluate` scores, as the only loader of the Data. An imagefolder
    root is read as the tree it is: with split folders, `split` picks one (default: test/, else
    val/, else train/, all of whose images are then scored); without, root/<class>/* itself is
    the test split. Images are read at `size` (the model's; default model.img_size, else the
    images' own). Other datasets: their test split (`split` may pick val)."""
    if cfg.data.dataset != "imagefolder":
        return _one_split(build_data(cfg, device), split, cfg.data.dataset)
    root = Path(cfg.data.root).expanduser()
    present = [s for s in EVAL_SPLITS if (root / s).is_dir()]
    if split is not None and split not in present and (present or split != "test"):
        raise DataError(f"--split {split}: data.root={str(root)!r} has no {split}/ folder "
                        f"(it has {', '.join(f'{s}/' for s in present) or 'class folders only'})")
    chosen = split or next(iter(present), None)
    folder = root / chosen if chosen else root
    try:
        probe = _raw_dataset("imagefolder", str(folder), "", transform=None)
    except (FileNotFoundError, OSError) as e:  # no such folder, or no class folders in it
        raise DataError(f"data.root={str(root)!r}: no images to evaluate ({e}); give a "
                        "folder of test/<class>/*, val/<class>/*, train/<class>/* or <class>/*"
                        ) from None
    native, mode = _first_image(probe)
    side = size or cfg.model.img_size or native
    mean, std = normalisation("imagefolder", len(mode))
    ds = _raw_dataset("imagefolder", str(folder), "",
                      transform=_transforms(False, side, native, mean, std, False, 0), mode=mode)
    loader = DataLoader(ds, batch_size=max(cfg.train.batch_size, 256), shuffle=False,
                        num_workers=cfg.data.num_workers)
    label = chosen or "test"
    return Data(train=loader if label == "train" else None,
                val=loader if label == "val" else None, test=loader if label == "test" else None,
                num_classes=len(ds.classes), in_chans=len(mode), img_size=side,
                classes=list(ds.classes))


def _one_split(data: Data, split: str | None, dataset: str) -> Data:
    """`data` with only the split evaluated: `split`, else its test split, else its val."""
    chosen = split or ("test" if data.test is not None else "val")
    loader = {"test": data.test, "val": data.val}.get(chosen)
    if loader is None:
        have = [s for s in ("test", "val") if getattr(data, s) is not None]
        raise DataError(f"--split {chosen}: data.dataset={dataset} has no {chosen} split to "
                        f"evaluate (it has {', '.join(have)})")
    return dataclasses.replace(data, train=None, val=loader if chosen == "val" else None,
                               test=loader if chosen == "test" else None)


def _first_image(ds) -> tuple[int, str]:
    """(side, "L" or "RGB") of an ImageFolder's first training image: its native size (the
    larger side) and whether it is grayscale."""
    from PIL import Image

    if not ds.samples:
        raise DataError(f"{ds.root}: no images in the class folders")
    path = ds.samples[0][0]
    try:
        with Image.open(path) as img:
            return max(img.size), "L" if img.mode in GRAY_MODES else "RGB"
    except OSError as e:
        raise DataError(f"{path}: not a readable image ({e}); remove or replace it") from None


def load_digits_arrays():
    """(images N x 8 x 8 in 0..16, labels) of scikit-learn's bundled digits. Read from the file
    sklearn ships when it is where sklearn keeps it: importing sklearn (scipy with it) costs more
    than a second of every quickstart run."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is None or not path.exists():
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    table = np.loadtxt(path, delimiter=",")  # 64 pixel columns, then the label
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


def _digits(cfg: Config):
    """scikit-learn's bundled 8x8 digits (1,797 images, 10 classes), resized once in memory."""
    images, labels = load_digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    size = cfg.model.img_size or DIGITS_SIDE
    if size != DIGITS_SIDE:
        x = torch.nn.functional.interpolate(
            x, size=(size, size), mode="bilinear", align_corners=False
        )
    x = (x - DIGITS_MEAN[0]) / DIGITS_STD[0]
    y = torch.tensor(labels, dtype=torch.long)
    if cfg.data.val_fraction <= 0:
        raise DataError("data.val_fraction must be > 0 for digits (it has no val split)")
    train_idx, val_idx = split_indices(len(y), cfg.data.val_fraction, cfg.train.seed)
    if cfg.data.train_limit:
        train_idx = train_idx[: cfg.data.train_limit]
    full = TensorDataset(x, y)
    full.source = TensorDataset(torch.from_numpy(images), y)  # as shipped (lineage digests)
    classes = [str(c) for c in range(10)]
    return Subset(full, train_idx), Subset(full, val_idx), None, classes, 1, size


def build_data(cfg: Config, device: torch.device) -> Data:
    if cfg.data.dataset == "digits":
        train_ds, val_ds, test_ds, classes, in_chans, size = _digits(cfg)
    else:
        train_ds, val_ds, test_ds, classes, in_chans, size = _image_splits(cfg, CIFAR_SIDE)
    if len(train_ds) == 0:
        raise DataError(f"data.root={cfg.data.root!r}: the training split is empty")
    if cfg.data.test_limit and test_ds is not None:
        test_ds = Subset(test_ds, sample_indices(len(test_ds), cfg.data.test_limit))

    d, t = cfg.data, cfg.train
    if d.on_device:
        return _resident(cfg, device, train_ds, val_ds, test_ds, classes, in_chans, size)
    common = dict(
        num_workers=d.num_workers,
        # Page-locked host memory lets `.to(device, non_blocking=True)` overlap the copy with
        # compute; on a CPU-only run there is no copy, so pinning would only cost time.
        pin_memory=d.pin_memory and device.type == "cuda",
        persistent_workers=d.num_workers > 0,
        worker_init_fn=seed_worker,
    )
    generator = torch.Generator().manual_seed(t.seed)
    shards = ranks.shards(len(train_ds), generator, t.batch_size)  # several ranks: each its share
    train = DataLoader(
        train_ds, batch_size=t.batch_size, shuffle=shards is None, sampler=shards,
        # A last batch of one image breaks BatchNorm's batch statistics; drop the remainder
        # (a different one each epoch, as the order is reshuffled) when a full batch exists.
        drop_last=len(train_ds) > t.batch_size, generator=generator, **common)

    def evaluation(ds):
        return DataLoader(ds, batch_size=max(t.batch_size, 256), shuffle=False,
                          sampler=ranks.eval_shard(len(ds)), **common)

    return Data(train=train, val=evaluation(val_ds),
                test=evaluation(test_ds) if test_ds is not None else None,
                num_classes=len(classes), in_chans=in_chans, img_size=size, classes=classes)


def _resident(cfg: Config, device: torch.device, train_ds, val_ds, test_ds, classes, in_chans,
              size) -> Data:
    """`data.on_device=true`: every split one tensor on `device` (accel.resident)."""
    from accel.resident import resident_loader

    batch, seed = cfg.train.batch_size, cfg.train.seed
    evaluation = max(batch, 256)
    return Data(
        train=resident_loader(train_ds, device, batch_size=batch, train=True, seed=seed,
                              flip=cfg.data.flip, padding=cfg.data.padding,
                              jitter=cfg.data.color_jitter),
        val=resident_loader(val_ds, device, batch_size=evaluation, train=False),
        test=(resident_loader(test_ds, device, batch_size=evaluation, train=False)
              if test_ds is not None else None),
        num_classes=len(classes), in_chans=in_chans, img_size=size, classes=classes,
    )
