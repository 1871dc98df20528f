"""`make slurm-check`'s fixed settings, shared by its halves (cluster.py starts the cluster,
study.py runs the study on it): the study's file and name, the PostgreSQL it uses, the log line."""

from __future__ import annotations

from checks.common import stamped

PG = "postgresql://postgres@127.0.0.1:5432/"
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

log = stamped("slurm-check")
