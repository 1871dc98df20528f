"""What `make slurm-check`'s two halves share (bench/slurm_check.py starts the cluster,
bench/slurm_study.py runs the study on it): the study's file, its name, the log line and the
wait. Imported by both; imports neither."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY = "slurmcheck"
EXPERIMENT = """\
# make slurm-check's study: accel_cnn_s on digits, long enough epochs to be stopped inside one.
name: slurmcheck
data: {dataset: digits, val_fraction: 0.2, num_workers: 0}
model: {name: accel_cnn_s, img_size: 8}
train: {epochs: EPOCHS, batch_size: 16, device: cpu, amp: "off", lr: 3.0e-3}
search:
  metric: val_accuracy
  direction: maximize
  sampler: random
  pruner: none
  space:
    train.lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}
"""


def log(msg: str) -> None:
    print(f"[slurm-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait_for(condition, what: str, proc: subprocess.Popen | None = None,
             timeout: float = 60) -> object:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process ended ({proc.returncode}) first")
        with contextlib.suppress(Exception):
            answer = condition()
            if answer:
                return answer
        time.sleep(0.5)
    raise RuntimeError(f"no {what} within {timeout:.0f} s")
