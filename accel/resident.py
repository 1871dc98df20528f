"""Device-resident data (`data.on_device=true`): each split held as one tensor on the training
device, shuffled, cropped, flipped and normalised there a batch at a time.

The fastest known CIFAR-10 trainings on a GPU never leave it: no DataLoader workers, no per-image
Python, no host-to-device copies. Each pass draws its whole shuffle and every image's crop offsets
and flip from one seeded CPU generator (so a checkpoint's generator state replays the pass
exactly, as `accel.train.loader.Batches` expects), then each batch is one gather: the
augmentation is torchvision's `RandomCrop(size, padding=size // 8)` (zero padding) followed by
`RandomHorizontalFlip()`, the same as the DataLoader path. On a CPU the split lives in memory and
only the per-batch, vectorised augmentation differs from `data.in_memory=true`.

In a data-parallel run (accel.ranks) every rank draws the same pass and takes its share of each
global batch (world x batch_size images), as `accel.ranks.ShardedShuffle` does for a DataLoader;
an evaluation split is cut to every world-th image beforehand.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Subset, TensorDataset


class ResidentLoader:
    """Batches of a split that lives on `device`. Images are uint8 [N, C, H, W] (normalised per
    batch with `mean`/`std` in [0, 1] units) or float tensors already normalised (`mean=None`).

    `pad > 0` augments: a random crop of the padded image (`padding`) and a horizontal flip, random
    per pass (`flip="random"`) or, `"alternating"` (airbench), drawn once per image and then
    reversed every other pass (`passes` counts them; a checkpoint keeps the count).
    `jitter > 0` (hiverge's cifar10-speedrun) shifts each normalised training image by a
    brightness offset drawn from U(-jitter, jitter), then scales it by a contrast factor from
    1 + U(-jitter, jitter), both drawn per image and pass after the crops and flips, so a run
    without it draws exactly what it drew before the option existed.
    `rank` of `world` takes positions rank, rank + world, ... of each global batch."""

    pin_memory = False  # nothing to copy: the batches are made where the model is

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, *, dataset, batch_size: int,
                 device: torch.device, mean=None, std=None, pad: int = 0, shuffle: bool = False,
                 drop_last: bool = False, generator: torch.Generator | None = None,
                 rank: int = 0, world: int = 1, flip: str = "random", padding: str = "zeros",
                 jitter: float = 0.0):
        self.jitter = jitter
        self.images, self.labels = images.to(device), labels.to(device)
        self.rank, self.world = rank, world
        self.passes = 0
        self.first_flips = None  # alternating: each image's flip in even passes
        if flip == "alternating" and pad:
            self.first_flips = torch.rand(len(labels), generator=generator) < 0.5
        self.dataset = dataset  # the source (lineage digests read it as for a DataLoader)
        self.batch_size, self.device, self.pad, self.padding = batch_size, device, pad, padding
        self.shuffle, self.drop_last, self.generator = shuffle, drop_last, generator
        self.shift = self.scale = None
        if mean is not None:  # (x / 255 - mean) / std == (x - 255 mean) / (255 std)
            shape = (1, -1, 1, 1)
            self.shift = (torch.tensor(mean, device=device) * 255).view(shape)
            self.scale = (torch.tensor(std, device=device) * 255).view(shape)

    def __len__(self) -> int:
        n, b = len(self.labels), self.batch_size * self.world
        return n // b if self.drop_last else -(-n // b)

    def draws(self) -> tuple[torch.Tensor, ...]:
        """One pass's randomness, all drawn up front: order, crop offsets [N, 2], flips [N] and
        tones [N, 2] (brightness offset, contrast factor); None for what the loader does not do."""
        n, g = len(self.labels), self.generator
        order = torch.randperm(n, generator=g) if self.shuffle else torch.arange(n)
        offsets = flips = tones = None
        if self.pad:
            offsets = torch.randint(0, 2 * self.pad + 1, (n, 2), generator=g)
            if self.first_flips is not None:
                flips = self.first_flips ^ bool(self.passes % 2)
            else:
                flips = torch.rand(n, generator=g) < 0.5
            self.passes += 1
        if self.jitter:
            tones = (torch.rand(n, 2, generator=g) * 2 - 1) * self.jitter
            tones[:, 1] += 1
        return order, offsets, flips, tones

    def __iter__(self):
        order, offsets, flips, tones = (t.to(self.device) if t is not None else None
                                        for t in self.draws())
        step = self.batch_size * self.world  # one update's images, all ranks together
        for i in range(len(self)):
            idx = order[i * step:(i + 1) * step][self.rank::self.world]
            x = self.images[idx]
            if offsets is not None:
                x = crop_flip(x, self.pad, offsets[idx], flips[idx], self.padding)
            if self.shift is not None:
                x = (x.float() - self.shift) / self.scale
            if tones is not None:
                tone = tones[idx].to(x.dtype)[:, :, None, None]
                x = (x + tone[:, :1]) * tone[:, 1:]
            yield x, self.labels[idx]


def crop_flip(x: torch.Tensor, pad: int, offsets: torch.Tensor, flips: torch.Tensor,
              padding: str = "zeros") -> torch.Tensor:
    """Each image's own crop of its padded copy (zeros, or `padding="reflect"`: mirrored at
    the edges), mirrored where `flips` says: one gather. `offsets[i] = (top, left)` in the
    padded image, each in [0, 2 * pad]."""
    b, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad), mode="reflect" if padding == "reflect" else "constant")
    rows = offsets[:, :1] + torch.arange(h, device=x.device)  # [B, h]
    cols = offsets[:, 1:] + torch.arange(w, device=x.device)  # [B, w]
    cols = torch.where(flips[:, None], cols.flip(1), cols)  # crop, then mirror: columns reversed
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    chans = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chans, rows[:, None, :, None], cols[:, None, None, :]]


def tensors_of(ds) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(images, labels, how to normalise and augment) of an in-memory split: an
    `accel.data.TensorImages` or a digits `TensorDataset`, possibly inside a `Subset`."""
    indices = None
    if isinstance(ds, Subset):
        indices, ds = torch.as_tensor(ds.indices, dtype=torch.long), ds.dataset
    if isinstance(ds, TensorDataset):
        images, labels = ds.tensors
        spec = {}
    else:  # accel.data.TensorImages: uint8, with its normalisation and augmentation
        images, labels = ds.images, ds.labels
        spec = {"mean": ds.mean, "std": ds.std, "pad": ds.pad, "size": ds.size}
    if indices is not None:
        images, labels = images[indices], labels[indices]
    return images, labels, spec


def first_images(ds, n: int) -> torch.Tensor:
    """The first `n` images of an in-memory split as training sees them before augmentation:
    float, at the trained size, normalised (model.whiten's sample)."""
    images, _, spec = tensors_of(ds)
    x, size = images[:n], spec.get("size")
    if size is not None and x.shape[-1] != size:
        from torchvision.transforms.v2 import functional as TF

        x = TF.resize(x, [size, size], antialias=True)
    if spec.get("mean") is None:  # digits: stored normalised
        return x.float()
    shape = (1, -1, 1, 1)
    mean, std = torch.tensor(spec["mean"]).view(shape), torch.tensor(spec["std"]).view(shape)
    return (x.float() / 255 - mean) / std


# Images resized at once: the resize works in fp32 (4 bytes a pixel) whatever it is given, so a
# whole split at once would need 50,000 x 3 x 224 x 224 x 4 bytes = 30 GB beside the uint8 copy
# (out of memory on a GPU of 40 GB or less); a chunk of 4,096 needs 2.5 GB.
RESIZE_CHUNK = 4096


def resize_split(images: torch.Tensor, size: int, chunk: int = RESIZE_CHUNK) -> torch.Tensor:
    """[N, C, H, W] uint8 -> [N, C, size, size] uint8, `chunk` images at a time (each image is
    resized on its own: the result is the whole-split resize's, bit for bit)."""
    from torchvision.transforms.v2 import functional as TF

    out = torch.empty((*images.shape[:-2], size, size), dtype=images.dtype,
                      device=images.device)
    for start in range(0, len(images), chunk):
        out[start:start + chunk] = TF.resize(images[start:start + chunk], [size, size],
                                             antialias=True)
    return out


def resident_loader(ds, device: torch.device, *, batch_size: int, train: bool,
                    seed: int = 0, flip: str = "random", padding: str = "zeros",
                    jitter: float = 0.0) -> ResidentLoader:
    """A split of `accel.data` as a `ResidentLoader`; training: shuffled, augmented, seeded.
    Several ranks: training shares each global batch out, evaluation takes every world-th image."""
    from accel import ranks

    images, labels, spec = tensors_of(ds)
    rank, world = ranks.rank(), ranks.world_size()
    if train and world > 1:
        ranks.check_fits(len(labels), batch_size)
    elif world > 1:
        images, labels = images[rank::world], labels[rank::world]
    pad, size = spec.pop("pad", 0), spec.pop("size", None)
    pad = pad if train else 0  # evaluation: no augmentation
    images = images.to(device)
    if size is not None and images.shape[-1] != size:  # resized once, as uint8, on the device
        images = resize_split(images, size)
    return ResidentLoader(
        images, labels, dataset=ds, batch_size=batch_size, device=device, pad=pad,
        shuffle=train, drop_last=train and len(labels) > batch_size,
        generator=torch.Generator().manual_seed(seed) if train else None,
        rank=rank if train else 0, world=world if train else 1, flip=flip, padding=padding,
        jitter=jitter if train else 0.0, **spec,
    )
