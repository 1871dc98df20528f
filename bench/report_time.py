"""How long `accel report` takes, and how much it writes, for a real study of N trials (goal:
under 10 s and 10 MB at 50 trials on 2 CPU cores).

Runs the quickstart study (`accel tune`, N trials, into a scratch folder), then times the whole
`accel report --study` command in a fresh process R times: the median and range of the wall
time, and the size of report.html and report.md. Prints the machine first.

    .venv/bin/python bench/report_time.py [--trials 50] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def accel(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "accel", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"accel {' '.join(args[:2])} failed:\n{proc.stderr[-3000:]}")
    return proc


def cpu() -> str:
    from accel.tracking import cpu_name

    return f"{cpu_name()}, {os.cpu_count()} cores, {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {cpu()}")
    with tempfile.TemporaryDirectory(prefix="accel-bench-report-") as tmp:
        where = ["--storage", f"{tmp}/optuna.journal", "--tracking-uri",
                 f"sqlite:///{tmp}/mlruns/mlflow.db"]
        began = time.perf_counter()
        accel("tune", "experiments/quickstart.yaml", "--study", "bench-report", "--n-trials",
              str(args.trials), *where)
        print(f"study: the quickstart, {args.trials} trials in "
              f"{time.perf_counter() - began:.0f} s")
        times = []
        for _ in range(args.runs):
            began = time.perf_counter()
            out = accel("report", "--study", "bench-report", *where).stdout
            times.append(time.perf_counter() - began)
        page = Path(re.search(r"^report: (.+)$", out, re.M).group(1))
        sizes = {p.name: p.stat().st_size for p in (page, page.with_suffix(".md"))}
    print("sizes: " + ", ".join(f"{name} {size / 1e6:.2f} MB" for name, size in sizes.items()))
    print(f"accel report --study (whole command, fresh process), {args.runs} runs: median "
          f"{statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f})")


if __name__ == "__main__":
    main()
