"""Decoded image folders kept on disk (accel.decoded): a split is decoded once per machine,
read back in the next process as the same pixels, decoded again when a file changes, and a
cache that is unreadable or cannot be written costs only the decoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from accel import data, decoded
from tests.conftest import ROOT, make_imagefolder

# Decodes the train split in a fresh process as a run does, counting the files it opens.
DECODE_ONCE = """
import hashlib, json, sys
from accel import data
opened = []
load = data.load_image
data.load_image = lambda path, mode="RGB": opened.append(path) or load(path, mode)
images, labels, _ = data._decode_all("imagefolder", sys.argv[1], "train", "RGB")
print(json.dumps({"opened": len(opened), "shape": list(images.shape),
                  "pixels": hashlib.sha256(images.numpy().tobytes()).hexdigest()}))
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path / "cache"))
    data._decode_all.cache_clear()
    yield make_imagefolder(tmp_path / "images", side=8, classes=2, per_class={"train": 5})
    data._decode_all.cache_clear()


def decode_counting(folder, monkeypatch) -> tuple[np.ndarray, int]:
    """The train split's pixels [N, C, H, W] as this process decodes them, and how many files
    it opened to do so."""
    opened = []
    load = data.load_image
    monkeypatch.setattr(data, "load_image", lambda p, mode="RGB": opened.append(p) or load(p, mode))
    data._decode_all.cache_clear()
    images, _, _ = data._decode_all("imagefolder", str(folder), "train", "RGB")
    return images.numpy(), len(opened)


def test_the_second_process_reads_the_first_ones_decoding(folder):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", DECODE_ONCE, str(folder)], env=env,
                                      capture_output=True, text=True, check=True).stdout)
            for _ in range(2)]
    assert runs[0]["opened"] == 10 and runs[1]["opened"] == 0
    assert runs[0]["shape"] == runs[1]["shape"] == [10, 3, 8, 8]
    assert runs[0]["pixels"] == runs[1]["pixels"]
    assert len(list((folder.parent / "cache" / "decoded").glob("*.npy"))) == 1


def test_the_kept_copy_holds_the_files_pixels(folder, monkeypatch):
    first, opened = decode_counting(folder, monkeypatch)
    again, reopened = decode_counting(folder, monkeypatch)
    assert opened == 10 and reopened == 0
    path = sorted((folder / "train" / "class1").iterdir())[2]
    want = np.asarray(Image.open(path).convert("RGB")).transpose(2, 0, 1)
    assert np.array_equal(again[5 + 2], want) and np.array_equal(again, first)


def test_a_rewritten_file_is_decoded_anew(folder, monkeypatch):
    before, _ = decode_counting(folder, monkeypatch)
    path = sorted((folder / "train" / "class0").iterdir())[1]
    Image.fromarray(np.full((8, 8, 3), 7, np.uint8)).save(path)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a coarse clock's mtime
    after, opened = decode_counting(folder, monkeypatch)
    assert opened == 10
    assert (after[1] == 7).all() and not (before[1] == 7).all()
    assert np.array_equal(np.delete(after, 1, 0), np.delete(before, 1, 0))


def test_a_relabelled_split_is_another_copy(folder, monkeypatch):
    decode_counting(folder, monkeypatch)
    (folder / "train" / "class1").rename(folder / "train" / "a_class")  # now sorted first
    _, opened = decode_counting(folder, monkeypatch)
    assert opened == 10


def test_an_unreadable_copy_is_decoded_again(folder, monkeypatch):
    first, _ = decode_counting(folder, monkeypatch)
    (kept,) = (folder.parent / "cache" / "decoded").glob("*.npy")
    kept.write_bytes(b"not an array")
    again, opened = decode_counting(folder, monkeypatch)
    assert opened == 10 and np.array_equal(again, first)
    assert np.array_equal(np.load(kept, allow_pickle=False).transpose(0, 3, 1, 2), first)


def test_a_cache_that_cannot_be_written_costs_only_the_decoding(folder, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(blocker))  # decoded/ cannot be made under a file
    first, opened = decode_counting(folder, monkeypatch)
    again, reopened = decode_counting(folder, monkeypatch)
    assert opened == reopened == 10 and np.array_equal(first, again)
    assert not list(tmp_path.glob("**/.decoding-*"))


def test_the_name_follows_the_colour_mode(folder):
    samples = [(str(p), 0) for p in sorted((folder / "train" / "class0").iterdir())]
    assert decoded.cache_file(samples, "RGB") != decoded.cache_file(samples, "L")
    assert decoded.cache_file(samples, "RGB") == decoded.cache_file(samples, "RGB")
