"""Where a run ran: versions, hardware, git state and seed (logged as `environment.json`), and
how two such records differ (printed before a rerun)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "torchvision", "pytorch-ignite", "timm", "mlflow", "optuna",
            "optuna-integration", "scikit-learn", "numpy", "pyyaml", "accel")
ENV_IGNORED = ("seed",)  # differs on purpose between an original run and a rerun
# Settings that change CPU results or speed: "bitwise on CPU" holds for the same values of these.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS",
                    "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "KMP_AFFINITY")


def git_state(cwd: str | Path | None = None) -> dict[str, Any]:
    """The commit of the checkout the code runs from, and whether it has uncommitted changes."""
    cwd = cwd or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return {"git_commit": None, "git_dirty": None}
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=10,
        )
        return {"git_commit": commit.stdout.strip(), "git_dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"git_commit": None, "git_dirty": None}


BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # a CPU without them emulates bf16


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's kind: its model name with its family and model numbers and its bf16
    instructions, e.g. 'AMD EPYC (family 25 model 17, avx512_bf16)'. A virtual machine often
    names every generation alike ('AMD EPYC': Zen 3, 4 and 5), whose speeds and bf16 differ,
    and the probes' caches (train.amp=auto, the peak) are keyed by this name."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        text = ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine()
    kind = [f"family {fields['cpu family']} model {fields['model']}"] \
        if "cpu family" in fields and "model" in fields else []
    kind += [flag for flag in fields.get("flags", "").split() if flag in BF16_FLAGS]
    return f"{name} ({', '.join(kind)})" if kind else name


def environment(device: str, seed: int) -> dict[str, Any]:
    """What a rerun needs to know about where this run ran (logged as environment.json)."""
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    cuda = torch.cuda.is_available()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,  # a run's ranks need one each
        # what fp32 math ran as (train.tf32 sets both before this is written)
        "tf32": ({"matmul": torch.backends.cuda.matmul.allow_tf32,
                  "cudnn": torch.backends.cudnn.allow_tf32} if cuda else "no CUDA"),
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "thread_env": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        "seed": seed,
        "packages": versions,
        **git_state(),
    }


def environment_diff(logged: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One line per entry that differs, package versions one by one. An entry the run did not
    record (an older accel) is no difference."""
    lines = []
    for key in sorted(set(logged) | set(current)):
        if key in ENV_IGNORED or key not in logged:
            continue
        old, new = logged.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            what = "package" if key == "packages" else key
            lines += [
                f"environment differs: {what} {name}: {old.get(name)} in the run, "
                f"{new.get(name)} here"
                for name in sorted(set(old) | set(new))
                if old.get(name) != new.get(name)
            ]
        elif old != new and not (key == "cpu" and str(new).startswith(f"{old} (")):  # a run
            # logged when the CPU was named without its family, model and bf16 instructions
            lines.append(f"environment differs: {key}: {old} in the run, {new} here")
    if logged.get("git_dirty"):
        lines.append(
            "the run's checkout had uncommitted changes (git_dirty): the code it ran "
            "is in no commit"
        )
    return lines
