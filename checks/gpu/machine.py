"""There, on the GPU machine: the steps' environment, the carried wheels installed into a scratch
folder, CIFAR-10 extracted there, and the provenance lines of the report. A dry run on the CPU
uses this interpreter as it is (no wheels) and the shared CIFAR-10 cache."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from checks.gpu.carry import (
    CARRIED,
    ROOT,
    TARBALL,
    TRAVEL_LIMIT,
    WHEELS,
    expected,
    mib,
    norm,
    travel_bytes,
    wheel_problem,
)
from checks.gpu.runner import Row


def child_env(work: Path, dry: bool) -> dict:
    """The steps' environment: the installed wheels and the repo on PYTHONPATH, CIFAR-10 and the
    MLflow store in the scratch folder, nothing written into the repo."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
    paths = ([] if dry else [str(work / "site")]) + [str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(paths), ACCEL_CACHE=str(work / "cache"),
               MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}", PYTHONUNBUFFERED="1",
               MPLBACKEND="Agg", ACCEL_WORK=str(work), ACCEL_DATA=str(data_root(work, dry)),
               ACCEL_PYTHON=sys.executable, MLFLOW_DISABLE_TELEMETRY="true")  # no network there
    if dry:  # docs/results.md: loaded 2-core machine, 1 OpenMP thread beats 2 spinning
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def data_root(work: Path, dry: bool = False) -> Path:
    """CIFAR-10's extracted tree: in the scratch folder there; here the shared cache's (a dry run
    reads a few thousand of its images, extracted once for every run here)."""
    if dry:
        from accel.shared_data import cache_dir

        return cache_dir() / "cifar10-jpeg"
    return work / "cache" / "cifar10-jpeg"  # what accel.shared_data extracts


def setup(work: Path, dry: bool, out: Path) -> Row:
    """The plan (wheels, size) and CIFAR-10 extracted; on the GPU also the wheels installed."""
    started = time.monotonic()
    log = [f"wheels planned ({len(expected())}): {', '.join(sorted(expected()))}"]
    notes = [f"{len(expected())} wheels planned"]
    ok = plan_ok(dry, notes) and bool(CARRIED)
    if not dry:
        ok = install(work, log, notes) and ok
    ok = extract(work, dry, log, notes) and ok
    log += notes
    (out / "setup.log").write_text("\n".join(log) + "\n")
    command = ("check .gpu/ and the size that travels; CIFAR-10 in the shared cache" if dry
               else "install .gpu/wheels into $WORK/site; extract CIFAR-10 into $WORK/cache")
    return Row("setup", command, "ok" if ok else "FAILED", time.monotonic() - started,
               "; ".join(notes), [] if ok else log[-15:])


def plan_ok(dry: bool, notes: list[str]) -> bool:
    """.gpu/wheels holds one wheel per expected name (needed on the GPU; checked here where it
    exists), and here: the working tree plus .gpu fit in what travels, its size printed."""
    if not WHEELS.is_dir():
        notes.append(f"no {WHEELS.relative_to(ROOT)}/ (run make gpu-wheels)")
        return dry
    problem = wheel_problem(WHEELS)
    if problem:
        notes.append(problem)
        return False
    if not dry:
        return True
    tree, carried = travel_bytes()
    notes.append(f"travels {mib(tree + carried)} of {mib(TRAVEL_LIMIT)} (.gpu {mib(carried)})")
    return tree + carried <= TRAVEL_LIMIT


def install(work: Path, log: list[str], notes: list[str]) -> bool:
    """pip install --target $WORK/site (no network, no deps), then `pip check` for the carried."""
    wheels = sorted(str(p) for p in WHEELS.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade", "--target",
           str(work / "site"), *wheels]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    log += [f"$ pip install ... ({len(wheels)} wheels): exit {done.returncode}", done.stdout,
            done.stderr]
    if done.returncode != 0:
        notes.append(f"pip install failed: {done.stderr.strip().splitlines()[-1:]}")
        return False
    env = {**os.environ, "PYTHONPATH": str(work / "site")}
    check = subprocess.run([sys.executable, "-m", "pip", "check"], env=env, capture_output=True,
                           text=True, timeout=120)
    carried = expected()
    unmet = [ln for ln in check.stdout.splitlines() if ln and norm(ln.split()[0]) in carried]
    log += ["$ pip check", check.stdout]
    notes.append(f"{len(wheels)} wheels installed; pip check: "
                 + (f"{len(unmet)} unmet needs of carried wheels: {'; '.join(unmet[:2])[:160]}"
                    if unmet else "the carried wheels' needs are met"))
    return True


def extract(work: Path, dry: bool, log: list[str], notes: list[str]) -> bool:
    """CIFAR-10 into $WORK/cache from .gpu/ there; here the shared cache (extracted once)."""
    from accel.shared_data import TARBALL as SHARED
    from accel.shared_data import cifar10_jpeg

    try:
        root = cifar10_jpeg(SHARED, None) if dry else cifar10_jpeg(TARBALL, work / "cache")
    except (OSError, ValueError) as e:
        notes.append(f"CIFAR-10 not extracted: {e}")
        return False
    n = sum(1 for _ in root.glob("*/*/*.jpg"))
    log.append(f"extracted {n} images into {root}")
    notes.append(f"CIFAR-10: {n} images")
    return True


def cuda_problem() -> str | None:
    """Why this machine cannot run the real check, or None."""
    try:
        import torch
    except ImportError as e:
        return f"CUDA is not available: torch does not import ({e})"
    if not torch.cuda.is_available():
        return ("CUDA is not available (torch.cuda.is_available() is False): this check needs "
                "a GPU; --dry-run rehearses it on a CPU")
    return None


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def provenance(dry: bool) -> list[str]:
    """Date, device, versions, commit: the report's first lines."""
    import torch

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"- date: {now}; host python {platform.python_version()}, torch {torch.__version__}"]
    if dry:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                    .splitlines() if ln.startswith("model name")), platform.processor())
        lines += [f"- device: cpu ({cpu}, {os.cpu_count()} cores)",
                  "- **dry run on CPU** (`--dry-run`): no wheels, no CUDA; tiny models and "
                  "sizes, the gpu tests only collected. No number here is a GPU result."]
    else:
        props = torch.cuda.get_device_properties(0)
        lines.append(f"- device: {torch.cuda.get_device_name(0)}, {props.total_memory / 2**30:.0f}"
                     f" GiB, {props.multi_processor_count} SMs; CUDA {torch.version.cuda}, "
                     f"cuDNN {torch.backends.cudnn.version()}")
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    except OSError:  # no git on the machine
        commit = ""
    lines.append(f"- commit: {commit or 'unknown (no git or no .git here)'}")
    return lines
