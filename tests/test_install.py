"""`make`'s install: TORCH_INDEX puts torch and torchvision from that index before the rest."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def install_commands(*variables: str) -> list[str]:
    """The commands `make` would run to install .venv (-n: printed, not run; -B: as if the
    install were due)."""
    proc = subprocess.run(["make", "-n", "-B", ".venv/.installed", *variables], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_torch_index_installs_torch_from_that_index_before_the_rest():
    lines = install_commands(f"TORCH_INDEX={CPU_INDEX}")
    [torch] = [i for i, line in enumerate(lines) if "--index-url" in line]
    [rest] = [i for i, line in enumerate(lines) if "-e '.[dev]'" in line]
    assert torch < rest
    assert lines[torch].endswith(f"pip install -q torch torchvision --index-url {CPU_INDEX}")
    assert not [line for line in install_commands() if "--index-url" in line or "torch" in line]
