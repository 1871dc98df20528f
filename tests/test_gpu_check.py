"""bench/gpu_check.py, rehearsed on this CPU: the dry run runs the GPU check's three steps at a
tiny size and writes the same report (a row per step, real numbers); without CUDA the real check
refuses in one line. The scratch folder, the MLflow store and the data cache all live in tmp_path.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "bench" / "gpu_check.py"
STEPS = ("setup", "gpu_tests", "ablate", "fast", "ddp")


def run_check(tmp_path: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """The script as `make gpu-check` runs it, with every scratch path under tmp_path."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "ACCEL_CACHE": str(tmp_path / "cache"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def table(markdown: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the markdown table whose header row starts with `first_header`."""
    lines = markdown.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))

    def cells(line: str) -> list[str]:
        return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]

    return [dict(zip(cells(lines[start]), cells(ln), strict=True))
            for ln in lines[start + 2:end]]


def test_every_carried_wheel_is_pinned_from_the_venv():
    """`make gpu-wheels` pins each CARRIED name to the version installed here."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert gpu_check.CARRIED and len(set(gpu_check.CARRIED)) == len(gpu_check.CARRIED)
    for name in gpu_check.CARRIED:
        assert metadata.version(name), name
    assert "mlflow" not in gpu_check.CARRIED  # the skinny client, not the UI's 12 MB wheel


def test_dry_run_runs_every_step_on_cpu_and_reports_real_numbers(tmp_path):
    def repo_store() -> list[str]:  # what the repo's own store holds (absent: nothing)
        return sorted(p.name for p in (ROOT / "mlruns").glob("*"))

    mlruns = repo_store()
    out = tmp_path / "out"
    done = run_check(tmp_path, "--dry-run", str(out), timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]

    report = (out / "gpu_check.md").read_text()
    assert "dry run on CPU" in report
    rows = {r["step"]: r for r in table(report, "step")}
    assert tuple(rows) == STEPS
    ddp = rows.pop("ddp")  # several GPUs only: a row that says why it did not run
    assert ddp["status"] == "skipped" and "ddp needs two or more GPUs" in ddp["key numbers"]
    assert "--techniques ddp,amp" in ddp["command"]
    for step, row in rows.items():
        assert row["status"] == "ok", (step, row)
        if step != "setup":
            assert float(row["seconds"]) > 0, (step, row)
    assert re.search(r"\b[1-9]\d* gpu test\(s\) collected", rows["gpu_tests"]["key numbers"])
    assert re.search(r"\b0 failed", rows["ablate"]["key numbers"])

    ablation = {r["combination"]: r for r in table(report, "combination")}
    assert float(ablation["baseline"]["val acc"]) > 0.5  # digits, learnt in 2 epochs
    assert ablation["pm"]["status"] == "n/a"  # pinned memory needs a GPU
    fast = dict(re.findall(r"^- (\w+): ([\d.]+)$", report, re.M))
    assert float(fast["time_to_target_s"]) > 0 and int(fast["epochs_to_target"]) in (1, 2)
    assert float(fast["val_accuracy"]) >= 0.5

    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(["gpu_check.md", *(f"{s}.log" for s in STEPS)])
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files) and len(files) <= 8
    assert repo_store() == mlruns  # nothing written into the repo's store
    assert not (ROOT / "mlflow.db").exists()
    assert not list((tmp_path / "tmp").glob("accel-gpu-check-*"))  # the scratch folder is gone


def test_without_cuda_the_real_check_refuses_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: without --dry-run the check would run for real")
    out = tmp_path / "out"
    done = run_check(tmp_path, str(out), timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUDA" in lines[0], done.stderr
    assert not out.exists()  # refused before anything was written
