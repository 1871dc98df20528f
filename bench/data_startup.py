"""A run's data start-up, with and without the decoded copy of the image folder kept on disk
(accel.decoded): a fresh interpreter builds the fast recipe's data as `accel train` does
(`accel.data.build_data`: CIFAR-10's 60,000 JPEGs into memory, the split, the resident loaders)
and exits. "decoded anew" gets an empty cache each round, "kept copy" the one its warm-up
wrote; they alternate round by round (`time_rounds` of bench/common.py). Prints each one's wall
time and the ratio kept / anew last.

    python -m accel.shared_data                  # the shared CIFAR-10, extracted once
    .venv/bin/python bench/data_startup.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import cpu_line, print_ratio, summary, time_rounds  # noqa: E402

BUILD = """
import sys, torch
from accel import config
from accel.data import build_data
cfg = config.load(sys.argv[1], [f"data.root={sys.argv[2]}", "train.device=cpu"])
data = build_data(cfg, torch.device("cpu"))
assert len(data.train.labels) == 45000, len(data.train.labels)
"""


def build(recipe: Path, root: Path, cache: Path) -> None:
    env = {**os.environ, "ACCEL_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", BUILD, str(recipe), str(root)], env=env, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--recipe", type=Path, default=ROOT / "experiments" / "cifar10_fast.yaml")
    args = ap.parse_args()
    from accel.shared_data import cifar10_jpeg

    root = cifar10_jpeg()
    with tempfile.TemporaryDirectory(prefix="accel-startup-") as tmp:
        kept = Path(tmp) / "kept"
        fresh = iter(range(1_000_000))
        times = time_rounds({
            "decoded anew": lambda: build(args.recipe, root, Path(tmp) / f"anew-{next(fresh)}"),
            "kept copy": lambda: build(args.recipe, root, kept),
        }, args.rounds)
    print(f"machine: {cpu_line()}; {args.recipe.name}, a fresh process each")
    for name, t in times.items():
        print(f"{name:14s} {summary(t)}")
    print_ratio(times, "kept copy", "decoded anew", "data start-up, kept / anew", ".3f")


if __name__ == "__main__":
    main()
