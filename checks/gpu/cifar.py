"""CIFAR-10 from the shared JPEGs as uint8 tensors, decoded once and cached beside them.

`split(root, "train")` -> (images uint8 [N, 32, 32, 3], labels int64 [N]), classes in the
ImageFolder order (sorted names: CIFAR-10's own order). `write_airbench(root, folder)` writes
airbench's `train.pt` / `test.pt` (its loader's format: {'images' NHWC uint8, 'labels', 'classes'})
so that airbench trains on exactly the pixels accel reads.
"""

from __future__ import annotations

from pathlib import Path

import torch


def split(root: Path, name: str, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                    list[str]]:
    """The split's images and labels: all of them (decoded once, then cached), or the first
    `limit` of a seeded shuffle (decoded on the spot)."""
    cache = root / f".{name}-uint8.pt"
    if limit is None and cache.exists():
        data = torch.load(cache, weights_only=True)
        return data["images"], data["labels"], list(data["classes"])
    images, labels, classes = _decode(root / name, limit)
    if limit is None:
        tmp = cache.with_suffix(".tmp")
        torch.save({"images": images, "labels": labels, "classes": classes}, tmp)
        tmp.replace(cache)  # two processes decoding at once each write a whole file
    return images, labels, classes


def selected(folder: Path, limit: int | None) -> tuple[list[tuple[Path, int]], list[str]]:
    """The split's (file, label) pairs: all, or the first `limit` of a seeded shuffle."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    files = [(f, i) for i, c in enumerate(classes) for f in sorted((folder / c).glob("*.jpg"))]
    if limit is not None and limit < len(files):
        keep = torch.randperm(len(files), generator=torch.Generator().manual_seed(0))[:limit]
        files = [files[i] for i in keep.tolist()]
    return files, classes


def peer_tree(root: Path, limit: int | None = None) -> Path:
    """An ImageFolder tree beside `root` for accel to train as airbench does: train/ the same
    images as `split(root, "train", limit)` (links), val/ and test/ the test images (accel
    needs a val split to hold none of the training images out)."""
    tree = root.parent / f"{root.name}-peer{f'-{limit}' if limit else ''}"
    if (tree / "test").exists():
        return tree
    tmp = tree.with_name(tree.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for name in ("val", "test"):
        (tmp / name).symlink_to(root / "test", target_is_directory=True)
    files, classes = selected(root / "train", limit)
    for c in classes:
        (tmp / "train" / c).mkdir(parents=True, exist_ok=True)
    for f, label in files:
        (tmp / "train" / classes[label] / f.name).symlink_to(f)
    tmp.rename(tree)
    return tree


def _decode(folder: Path, limit: int | None) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    import numpy as np
    from PIL import Image

    files, classes = selected(folder, limit)
    pixels = np.stack([np.asarray(Image.open(f).convert("RGB")) for f, _ in files])
    return (torch.from_numpy(pixels), torch.tensor([i for _, i in files], dtype=torch.int64),
            classes)


def write_airbench(root: Path, folder: Path, train_limit: int | None = None,
                   test_limit: int | None = None) -> Path:
    """`folder`/train.pt and test.pt from the JPEG tree at `root`; returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, limit in (("train", train_limit), ("test", test_limit)):
        images, labels, classes = split(root, name, limit)
        torch.save({"images": images, "labels": labels, "classes": classes},
                   folder / f"{name}.pt")
    return folder
