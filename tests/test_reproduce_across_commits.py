"""Runs logged before the run's order moved into `accel.train.run.Run` still reproduce exactly:
a run trained by accel's code as it was at BEFORE (taken from git into a folder of its own, in
a process of its own) is reproduced by today's `accel reproduce`, bitwise. The run has the
ingredients whose order the change moved: a budget's plan, the whitening bias held after its
share, the moving average."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from io import BytesIO

import pytest
from mlflow import MlflowClient

from accel import cli
from tests.conftest import ROOT, TINY_OVERRIDES, new_store

BEFORE = "6005c1a"  # the last commit before accel.train.run.Run
INGREDIENTS = ("model.name=accel_cnn_s", "model.whiten=2", "model.whiten_images=100",
               "train.whiten_bias_epochs=1", "train.ema_decay=0.9", "train.budget_s=3",
               "train.epochs=3", "train.bn_bias_lr_scale=64")


def _code_at(commit: str, to) -> None:
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "accel"],
                                 capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"commit {commit} is not in this checkout's git history: {e}")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(to, filter="data")


def test_a_run_logged_before_the_run_object_reproduces_exactly(tmp_path, capsys):
    _code_at(BEFORE, tmp_path / "before")
    uri = new_store(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "before")}
    older = [o for o in TINY_OVERRIDES if not o.startswith("tracking.figures")]  # a later key
    trained = subprocess.run(
        [sys.executable, "-m", "accel", "train", *older, *INGREDIENTS,
         f"tracking.uri={uri}"], cwd=tmp_path / "before", env=env, capture_output=True,
        text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert str(tmp_path / "before") in subprocess.run(  # the run was made by the old code
        [sys.executable, "-c", "import accel; print(accel.__file__)"], cwd=tmp_path / "before",
        env=env, capture_output=True, text=True).stdout
    [run] = MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()])
    run_id = run.info.run_id
    assert cli.main(["reproduce", run_id, "--tracking-uri", uri]) == 0
    assert "(exactly)" in capsys.readouterr().out
