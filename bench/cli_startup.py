"""`accel --help` start-up time: a fresh interpreter each time, median of N (goal < 0.5 s).

The CLI imports torch, mlflow and optuna only inside the commands, so `--help` should cost little
more than Python's own start-up, which is timed alongside for reference. Prints the time last.

    .venv/bin/python bench/cli_startup.py [--runs 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall(cmd: list[str], runs: int) -> list[float]:
    subprocess.run(cmd, cwd=ROOT, capture_output=True, check=True)  # warm the page cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()

    script = shutil.which("accel", path=str(Path(sys.executable).parent))
    contenders = {"python -c pass": [sys.executable, "-c", "pass"],
                  "python -m accel --help": [sys.executable, "-m", "accel", "--help"]}
    if script:
        contenders["accel --help"] = [script, "--help"]
    medians = {}
    for name, cmd in contenders.items():
        times = wall(cmd, args.runs)
        medians[name] = statistics.median(times)
        print(f"{name:24s} median {medians[name]:.3f} s  min {min(times):.3f}  "
              f"max {max(times):.3f}  ({args.runs} runs)")
    name = "accel --help" if script else "python -m accel --help"
    print(f"{name} wall time: {medians[name]:.3f} s (median of {args.runs}; goal < 0.5 s)")


if __name__ == "__main__":
    main()
