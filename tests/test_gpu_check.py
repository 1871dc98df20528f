"""checks/gpu, rehearsed on this CPU: the dry run runs every step of the GPU check at a
tiny size and writes the same report (a row per step, real numbers, the paper's tables, airbench
beside accel, the syncs); without CUDA the real check refuses in one line. The scratch folder and
the MLflow store live in tmp_path; CIFAR-10 comes from the shared cache."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from checks.gpu import carry, plan, summaries
from checks.gpu.runner import Step, run_step
from tests.conftest import ROOT

STEPS = ("setup", *plan.STEP_NAMES)
SETUP_S = 35  # planned for setup on the GPU (checks/gpu/plan.py)


def run_check(tmp_path: Path, *args: str, timeout: int,
              path: str | None = None) -> subprocess.CompletedProcess:
    """The check as `make gpu-check` runs it, with every scratch path under tmp_path; `path`
    goes on PYTHONPATH (an airbench wheel)."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "checks.gpu", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def table(markdown: str, first_header: str, after: str = "") -> list[dict[str, str]]:
    """The rows of the first markdown table whose header starts with `first_header` (after the
    line `after`, when given)."""
    lines = markdown.splitlines()
    begin = lines.index(after) if after else 0
    start = next(i for i in range(begin, len(lines))
                 if lines[i].startswith(f"| {first_header} |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))

    def cells(line: str) -> list[str]:
        return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]

    return [dict(zip(cells(lines[start]), cells(ln), strict=True))
            for ln in lines[start + 2:end]]


def test_every_carried_wheel_is_pinned_from_the_venv():
    """`make gpu-wheels` pins each CARRIED name to the version installed here."""
    assert carry.CARRIED and len(set(carry.CARRIED)) == len(carry.CARRIED)
    for name in carry.CARRIED:
        assert metadata.version(name), name
    assert "mlflow" not in carry.CARRIED  # the skinny client, not the UI's 12 MB wheel
    assert carry.AIRBENCH == ("airbench", "0.1.8") and "airbench" in carry.expected()


def test_the_plan_ends_within_eight_minutes_in_its_order_of_value():
    assert plan.STEP_NAMES[:3] == ("paper", "fast", "syncs")
    assert set(plan.TIMEOUTS) == set(plan.STEP_NAMES) == set(plan.DRY_TIMEOUTS)
    one_gpu = sum(t for name, t in plan.TIMEOUTS.items() if name != "ddp")
    assert SETUP_S + one_gpu <= plan.BUDGET_S <= 480
    steps = plan.steps(sys.executable, False, Path("/data"), gpus=1)
    assert [s.name for s in steps] == list(plan.STEP_NAMES)
    assert all(0 < s.timeout <= plan.BUDGET_S for s in steps)
    assert steps[-1].skip and "two or more GPUs" in steps[-1].skip


def test_a_timed_out_step_keeps_what_it_measured(tmp_path):
    """The step is ended at its timeout (its whole process group), and its row still holds the
    results it printed before."""
    code = ("from checks.gpu.records import emit; import time; emit(step='syncs', amp='off', "
            "model='m', updates=1, step_reads=0.0, trainer_reads=1.0, reads_by={}, "
            "cuda_syncs=None, cuda_where=[]); time.sleep(60)")
    step = Step("syncs", [sys.executable, "-c", code], 6, summaries.syncs, title="Syncs")
    env = {**os.environ, "ACCEL_WORK": str(tmp_path), "PYTHONPATH": str(ROOT)}
    row = run_step(step, env, tmp_path, deadline=10**12)
    assert row.status == "FAILED" and row.seconds < 30
    assert row.numbers.startswith("timed out after 6 s") and "off: step 0.0" in row.numbers
    assert "| off | 0.0 | 1.0 |" in row.section


def _airbench_wheel(folder: Path) -> str | None:
    """The fast step runs airbench94 from its wheel, which `make gpu-wheels` builds from PyPI's
    sdist into .gpu/; where a fresh checkout has none, it is built into `folder` (pure Python,
    seconds) and imported from there (PYTHONPATH), leaving .gpu/ as `make gpu-wheels` left it."""
    if carry.airbench_wheel() is not None:
        return None
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--disable-pip-version-check", "--no-binary", carry.AIRBENCH[0],
                            "-w", str(folder), "==".join(carry.AIRBENCH)],
                           capture_output=True, text=True, timeout=600)
    wheel = carry.airbench_wheel(folder)
    if built.returncode != 0 or wheel is None:
        pytest.fail(f"building the airbench wheel failed: {built.stderr[-2000:]}")
    return str(wheel)


# Real CIFAR-10 and every step of the check (~2.5 min on 2 cores): make test-all; make test
# covers the plan and the report's parsing in this file's other tests.
@pytest.mark.slow
@pytest.mark.skipif(not Path(carry.ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.gz")
                    .exists(), reason="the shared CIFAR-10 (../shared/data) is absent")
def test_dry_run_runs_every_step_on_cpu_and_reports_real_numbers(tmp_path):
    def repo_store() -> list[str]:  # what the repo's own store holds (absent: nothing)
        return sorted(p.name for p in (ROOT / "mlruns").glob("*"))

    mlruns = repo_store()
    wheel = _airbench_wheel(tmp_path / "wheels")
    out = tmp_path / "out"
    done = run_check(tmp_path, "--dry-run", str(out), timeout=plan.DRY_BUDGET_S + 120,
                     path=wheel)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]

    report = (out / "gpu_check.md").read_text()
    assert "dry run on CPU" in report
    rows = {r["step"]: r for r in table(report, "step")}
    assert tuple(rows) == STEPS
    ddp = rows.pop("ddp")  # several GPUs only: a row that says why it did not run
    assert ddp["status"] == "skipped" and "ddp needs two or more GPUs" in ddp["key numbers"]
    for step, row in rows.items():
        assert row["status"] == "ok", (step, row)
    assert re.search(r"\b[1-9]\d* gpu test\(s\) collected", rows["gpu_tests"]["key numbers"])
    assert re.search(r"\b0 failed", rows["ablate"]["key numbers"])
    check_paper(report)
    fast = {r["side"]: r for r in table(report, "side")}
    assert float(fast["airbench94"]["training s"]) > 0 and float(fast["accel"]["training s"]) > 0
    assert 0 <= float(fast["airbench94"]["test acc"]) <= 1
    assert float(fast["accel"]["time to target s"]) > 0  # digits reach 0.5 in 2 epochs
    assert float(fast["accel muon"]["training s"]) > 0  # the Muon arm, within the budget
    syncs = {r["amp"]: r for r in table(report, "amp")}
    assert syncs["off"]["step: host reads / update"] == "0.0" == syncs["bf16"][
        "step: host reads / update"]

    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(["gpu_check.md", *(f"{s}.log" for s in STEPS)])
    assert repo_store() == mlruns  # nothing written into the repo's store
    assert not (ROOT / "mlflow.db").exists()
    assert not list((tmp_path / "tmp").glob("accel-gpu-check-*"))  # the scratch folder is gone


def check_paper(report: str) -> None:
    """A table per model, every precision mode measured, GA and the DataLoader path too."""
    for model in ("test_resnet", "test_vit", "test_efficientnet"):
        rows = {r["mode"]: r for r in table(report, "mode", after=next(
            ln for ln in report.splitlines() if ln.startswith(f"**{model}**")))}
        for mode in ("fp32 (TF32 off)", "TF32", "bf16", "fp16 + GradScaler"):
            assert float(rows[mode]["img/s"]) > 0, (model, mode)
        assert rows["fp32 (TF32 off)"]["x fp32"] == "1.00x"
        # MFU against the peak measured here in the row's precision; a CPU has no data sheet.
        for row in (r for r in rows.values() if re.fullmatch(r"[\d.]+", r["img/s"])):
            mfu, peak = row["MFU (measured peak)"].split(" of ")
            assert 0 < float(mfu) <= 1 and float(peak) > 0, (model, row)
            assert row["MFU (data sheet)"] == "not listed"
        assert any(" GA " in m and float(r["img/s"]) > 0 for m, r in rows.items()), model
        assert any(m.endswith("DataLoader") and float(r["img/s"]) > 0
                   for m, r in rows.items()), model
        assert ("bf16 + channels_last" in rows) == (model != "test_vit")


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


def test_a_failed_paper_row_is_a_result_and_a_model_without_numbers_fails_the_step():
    """One row out of memory is shown as such and the step stays ok; a model with no number at
    all fails it. Each number is the median of three timed blocks, their range beside it."""
    import json

    from checks.gpu import summaries
    from checks.gpu.records import MARK

    def row(model, mode, **result):
        return MARK + json.dumps({"step": "paper", "model": model, "mode": mode, "amp": "off",
                                  "tf32": True, "channels_last": False, "accumulation": 1,
                                  "loader": "", "compile": "", **result})

    fine = {"img_s": 100.0, "img_s_min": 90.0, "img_s_max": 110.0, "peak_gib": 1.0}
    lines = [row(m, "TF32", **fine) for m in ("a", "b", "c")]
    lines.append(row("c", "bf16", error="OutOfMemoryError: CUDA out of memory"))
    done = summaries.paper("\n".join(lines), {})
    assert done.ok and "1 row(s) failed" in done.numbers
    assert "| TF32 | 100 | 90–110 |" in done.section and "OutOfMemoryError" in done.section
    none = summaries.paper("\n".join(lines[:2] + [row("c", "TF32", error="boom")]), {})
    assert not none.ok


def test_the_fast_step_says_what_muon_did_or_that_it_did_not_run():
    """The fast step's key numbers: airbench94's seconds, accel's time to target and test
    accuracy, then the Muon arm's (side `accel muon`), or that the budget left it out."""
    import json

    from checks.gpu.records import MARK

    def row(side, seed, seconds, test_acc, hit=None):
        return MARK + json.dumps({"step": "fast", "side": side, "seed": seed, "seconds": seconds,
                                  "test_acc": test_acc, "time_to_target_s": hit})

    lines = [row("airbench94", 0, 4.0, 0.94), row("airbench94", 1, 4.2, 0.94),
             row("accel", 0, 5.0, 0.941, 4.5), row("accel", 1, 5.1, 0.939, 4.7)]
    without = summaries.fast("\n".join(lines), {})
    assert without.ok and without.numbers.endswith("; no Muon run within the budget")
    assert "accel 4.6 s to target (1.12x airbench94's time)" in without.numbers
    muon = lines + [row("accel muon", 0, 3.5, 0.942, 3.1), row("accel muon", 1, 3.6, 0.938)]
    done = summaries.fast("\n".join(muon), {})
    assert done.numbers.endswith("; Muon 3.1 s to target, 0.9400 test")
    assert "| accel muon | 1 | 3.60 | 0.9380 | – |" in done.section
