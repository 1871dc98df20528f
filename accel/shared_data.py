"""The shared real CIFAR-10 (JPEG, ImageFolder layout), extracted once into a cache folder.

`../shared/data/cifar10-jpeg.tar.gz` lives beside the project, not in it. Slow tests, benchmarks
and `experiments/cifar10_cpu.yaml` read an extracted copy under `~/.cache/accel/` (never inside
the repo):

    python -m accel.shared_data          # extracts if needed (a few seconds), prints the root
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARBALL = ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"
SHA256 = "7bca004bbcae66d2d20cc1564737e461720c932af762ab51f8c97b082b93446a"  # data/README.md
FOLDER = "cifar10-jpeg"  # the tarball's top-level folder: FOLDER/{train,test}/<class>/*.jpg


def cache_dir() -> Path:
    """$ACCEL_CACHE, else $XDG_CACHE_HOME/accel, else ~/.cache/accel."""
    if os.environ.get("ACCEL_CACHE"):
        return Path(os.environ["ACCEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "accel"


def run_cache_dir() -> Path:
    """Where runs keep what they compute once (the precision probe's answers, decoded image
    folders): $ACCEL_CACHE_DIR, else ~/.cache/accel."""
    return Path(os.environ.get("ACCEL_CACHE_DIR") or Path.home() / ".cache" / "accel")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cifar10_jpeg(tarball: Path = TARBALL, cache: Path | None = None) -> Path:
    """The extracted root (with train/ and test/), extracting it on first use.

    Extraction goes to a temporary folder that is renamed into place, so two processes that race
    (parallel tests, a benchmark) never see a half-extracted tree.
    """
    cache = cache or cache_dir()
    target = cache / FOLDER
    stamp = target / ".sha256"
    if stamp.exists() and stamp.read_text().strip() == SHA256:
        return target
    if not tarball.exists():
        raise FileNotFoundError(f"{tarball} is missing (see ../shared/data/README.md)")
    if sha256(tarball) != SHA256:
        raise ValueError(f"{tarball}: sha256 differs from {SHA256}; the file is damaged")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=cache))
    try:
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, filter="data")  # "data": no absolute paths or links outside tmp
        (tmp / FOLDER / ".sha256").write_text(SHA256 + "\n")
        if target.exists():
            shutil.rmtree(target)  # an older or interrupted copy without a valid stamp
        try:
            (tmp / FOLDER).rename(target)
        except OSError:
            if not (stamp.exists() and stamp.read_text().strip() == SHA256):
                raise  # not another process that won the race: a real error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def jpeg_copy_hint() -> str:
    """Offline, where the JPEG copy of CIFAR-10 lies beside the project: the overrides that
    train on it instead (for the error of a missing python-version CIFAR-10)."""
    root = cache_dir() / FOLDER
    if not (root.is_dir() or TARBALL.exists()):
        return ""
    first = "" if root.is_dir() else "`python -m accel.shared_data` (extracts it), then "
    return (f"; offline, the JPEG copy of CIFAR-10 beside the project: {first}"
            f"data.dataset=imagefolder data.root={root}")


def shared_data_hint(root: str) -> str:
    """Where `root` is where the shared CIFAR-10 is extracted: the command that extracts it."""
    if Path(root).expanduser() == cache_dir() / FOLDER:
        return "; `python -m accel.shared_data` extracts the shared CIFAR-10 there"
    return ""


if __name__ == "__main__":
    try:
        print(cifar10_jpeg())
    except (FileNotFoundError, ValueError) as e:
        print(f"accel.shared_data: {e}", file=sys.stderr)
        sys.exit(2)
