"""Which data a run saw: one MLflow dataset input per split (the UI's "Datasets" column).

Each split is logged with its name (`digits-train`), source (the data folder, or the library that
ships it), a digest of exactly the samples it holds, its size and class names, and its context
(`training`, `validation`, `testing`). The digest hashes what identifies each sample, not the
pixels as transformed: the file's relative path, size and label for an image folder; the raw
bytes and labels for CIFAR's arrays; the sample indices and labels for scikit-learn's digits.
Two runs on other data, another split or another `data.train_limit` get other digests; the same
data always the same.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

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
    """(number of samples, digest) of a dataset, through any Subset wrappers."""
    indices = None
    while hasattr(dataset, "indices") and hasattr(dataset, "dataset"):  # torch Subset
        outer = list(dataset.indices)
        indices = outer if indices is None else [outer[i] for i in indices]
        dataset = dataset.dataset
    index = list(range(len(dataset))) if indices is None else indices
    h = hashlib.sha256()
    if hasattr(dataset, "samples"):  # ImageFolder: relative path, size and label of each file
        root = str(getattr(dataset, "root", ""))
        for i in index:
            path, label = dataset.samples[i]
            h.update(f"{os.path.relpath(path, root)}\0{os.path.getsize(path)}\0{label}\n"
                     .encode())
    elif hasattr(dataset, "data") and hasattr(dataset, "targets"):  # CIFAR's arrays
        h.update(dataset.data[index].tobytes())
        h.update(json.dumps([int(dataset.targets[i]) for i in index]).encode())
    else:  # in-memory tensors (digits, decoded images): which samples, and their labels
        labels = _labels(dataset)
        h.update(json.dumps(index).encode())
        h.update(json.dumps([int(labels[i]) for i in index]).encode())
    return len(index), h.hexdigest()[:DIGEST_CHARS]


def _labels(dataset) -> Any:
    if hasattr(dataset, "labels"):  # accel.data.TensorImages
        return dataset.labels
    return dataset.tensors[1]  # TensorDataset(x, y)


def log_splits(client, run_id: str, records: list[dict]) -> None:
    """The records as MLflow dataset inputs of the run."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = [DatasetInput(
        Dataset(r["name"], r["digest"], "local", json.dumps({"uri": r["source"]}),
                profile=json.dumps(r["profile"])),
        tags=[InputTag("mlflow.data.context", r["context"])]) for r in records]
    client.log_inputs(run_id, datasets=inputs)
