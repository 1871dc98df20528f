"""What a newcomer's mistakes get back: one line, exit 2, fast, naming what was meant."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_cli

HEAVY = ("torch", "timm", "ignite", "mlflow", "optuna")


@pytest.mark.parametrize("command", ["train", "tune", "ablate"])
def test_a_bad_config_key_answers_before_the_heavy_libraries_load(command):
    """The config is checked first: a typo costs a fraction of a second, not the seconds that
    importing torch, timm, ignite, MLflow and Optuna take. `-X importtime` lists every module
    the real command imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "accel", command,
                           "train.lrr=1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "accel.config" in imported  # the listing works
    assert not sorted(m for m in imported if m.split(".")[0] in HEAVY)
    [error] = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert error.startswith("accel: error: unknown config key 'train.lrr'; did you mean train.lr")


def one_error_line(*args: str) -> str:
    proc = run_cli(*args, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    return line


def test_optional_arguments_are_not_listed_as_required():
    line = one_error_line("evaluate")
    assert "required: MODEL_URI (see `accel evaluate --help`)" in line, line
    assert "[CONFIG]" not in line


@pytest.mark.parametrize("argv,meant", [
    (["tune", "--n-trails", "5"], "--n-trials"),
    (["tune", "--n-trails=5"], "--n-trials"),
    (["best", "--study", "s", "--registr", "x"], "--register"),
    (["trian"], "train"),
])
def test_a_mistyped_option_or_command_gets_what_was_meant(argv, meant):
    line = one_error_line(*argv)
    assert f"; did you mean {meant}? (see `accel" in line, line
