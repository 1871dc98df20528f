"""Which data a run saw: one MLflow dataset input per split (the UI's "Datasets" column).

Each split is logged with its name (`digits-train`), source (the data folder, or the library that
ships it), a digest of exactly the samples it holds, its size and class names, and its context
(`training`, `validation`, `testing`). The digest hashes each sample's content and label, in the
split's order: the bytes of each image file of an image folder; the pixels of CIFAR's arrays and
of scikit-learn's digits as shipped. A split held in memory or on the device (`data.in_memory`,
`data.on_device`) is hashed through the files or arrays it was decoded from, so the same data
gets one digest whichever way it is held, and other pixels, another split or another
`data.train_limit` another one. Neither the model's input size nor the transforms change it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os

import numpy as np

CONTEXTS = {"train": "training", "val": "validation", "test": "testing"}
DIGEST_CHARS = 16


def split_record(name: str, split: str, dataset, source: str, classes: list[str]) -> dict:
    """What one split is: name, digest, source and profile."""
    samples, digest = _walk(dataset)
    return {"name": f"{name}-{split}", "digest": digest, "source": source,
            "context": CONTEXTS[split], "profile": {"samples": samples,
                                                    "num_classes": len(classes),
                                                    "classes": classes}}


def _walk(dataset) -> tuple[int, str]:
    """(number of samples, digest) of a dataset, through any Subset wrappers and in-memory
    copies (`source`: the files or arrays an in-memory split was decoded from)."""
    indices = None
    while hasattr(dataset, "indices") and hasattr(dataset, "dataset"):  # torch Subset
        outer = list(dataset.indices)
        indices = outer if indices is None else [outer[i] for i in indices]
        dataset = dataset.dataset
    if getattr(dataset, "source", None) is not None:
        dataset = dataset.source
    index = list(range(len(dataset))) if indices is None else indices
    h = hashlib.sha256()
    if hasattr(dataset, "samples"):  # ImageFolder: the bytes of each file, its label
        for i in index:
            path, label = dataset.samples[i]
            h.update(_file_digest(path, *_stamp(path)))
            h.update(label.to_bytes(8, "little"))
    else:  # arrays: CIFAR's [N, H, W, C] uint8, a TensorDataset's tensors
        pixels, labels = _arrays(dataset)
        h.update(np.ascontiguousarray(np.asarray(pixels)[index]).tobytes())
        h.update(json.dumps([int(labels[i]) for i in index]).encode())
    return len(index), h.hexdigest()[:DIGEST_CHARS]


def _stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=1 << 20)
def _file_digest(path: str, size: int, mtime_ns: int) -> bytes:
    """sha256 of one file, kept per (path, size, mtime) for the process: each trial of a study
    logs the same splits again (CIFAR-10: 60,000 files)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


def _arrays(dataset):
    """(pixels, labels) of an array dataset: CIFAR's `data`/`targets`, or a TensorDataset."""
    if hasattr(dataset, "data") and hasattr(dataset, "targets"):
        return dataset.data, dataset.targets
    images, labels = dataset.tensors
    return images.numpy(), labels


def log_splits(client, run_id: str, records: list[dict]) -> None:
    """The records as MLflow dataset inputs of the run."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = [DatasetInput(
        Dataset(r["name"], r["digest"], "local", json.dumps({"uri": r["source"]}),
                profile=json.dumps(r["profile"])),
        tags=[InputTag("mlflow.data.context", r["context"])]) for r in records]
    try:
        client.log_inputs(run_id, datasets=inputs)
    except Exception as e:
        # Two processes logging the same new dataset at once: MLflow checks it is absent, then
        # inserts it, and the slower insert fails; the dataset is there now, so once more works.
        if "UNIQUE constraint failed" not in str(e) and "duplicate key" not in str(e):
            raise
        client.log_inputs(run_id, datasets=inputs)
