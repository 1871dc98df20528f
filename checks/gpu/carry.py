"""Where pip reaches the registries: `make gpu-wheels` fills .gpu/ with what the GPU machine needs.

The GPU machine's python3 (3.12, torch with CUDA, timm, torchvision, scikit-learn, pytest) lacks
MLflow, Optuna and Ignite, and has no network. `.gpu/wheels` holds one wheel per CARRIED name,
pinned to the version in .venv, plus airbench's wheel (PyPI has only its sdist, so it is built
here); `.gpu/` also holds a copy of the CIFAR-10 JPEG tarball. With the working tree it is copied
to the GPU machine, which takes at most 64 MiB.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from checks.common import ROOT

GPU_DIR = ROOT / ".gpu"  # git-ignored; copied to the GPU machine with the working tree
WHEELS = GPU_DIR / "wheels"
TARBALL = GPU_DIR / "cifar10-jpeg.tar.gz"
TRAVEL_LIMIT = 64 * 2**20  # bytes: the working tree and .gpu/ together, as the GPU machine takes
PYTHON = "3.12"  # the GPU machine's python3
# pip matches platform tags exactly: every manylinux the machine's glibc (2.39) can load.
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)), "manylinux2014_x86_64",
             "manylinux1_x86_64")
# The peer of the `fast` step and of peer_airbench.py (Jordan 2024), an sdist on PyPI.
AIRBENCH = ("airbench", "0.1.8")

# What the machine's python3 lacks for `accel train`, `accel ablate` and the tests: the
# Requires-Dist closure of these, minus the packages that python3 has (above).
# mlflow-skinny and mlflow-tracing hold all of `mlflow`'s Python code; the full `mlflow` wheel
# adds the UI's JavaScript and server dependencies. The SQLite store needs sqlalchemy + alembic,
# and its model-registry tables import cryptography (a dependency of the full wheel only).
# mlflow imports pydantic, fastapi, opentelemetry and databricks (a find_spec) on the training
# path. Left behind: plotly (`accel tune`'s study plots) and psycopg2-binary (PostgreSQL).
CARRIED = (
    # the MLflow client and its SQLite store
    "mlflow-skinny", "mlflow-tracing", "sqlalchemy", "alembic", "mako", "sqlparse",
    "cryptography", "cffi", "pycparser", "cachetools", "gitpython", "gitdb", "smmap",
    "python-dotenv", "importlib-metadata", "databricks-sdk", "google-auth", "pyasn1",
    "pyasn1-modules", "fastapi", "starlette", "uvicorn", "pydantic", "pydantic-core",
    "annotated-types", "typing-inspection", "opentelemetry-api", "opentelemetry-sdk",
    "opentelemetry-proto", "opentelemetry-semantic-conventions",
    # the training loop and the tuner (the tests import both)
    "pytorch-ignite", "optuna", "optuna-integration", "colorlog",
)


def norm(name: str) -> str:
    """A distribution's canonical name (PEP 503): 'Mako', 'pydantic_core' -> 'mako', ..."""
    return re.sub(r"[-_.]+", "-", name).lower()


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def fail(message: str) -> int:
    print(f"gpu_check: {message}", file=sys.stderr)
    return 1


def expected() -> set[str]:
    return {*map(norm, CARRIED), AIRBENCH[0]}


def airbench_wheel(folder: Path = WHEELS) -> Path | None:
    """The carried airbench wheel (pure Python: importable from the .whl itself), or None."""
    return next(iter(sorted(folder.glob(f"{AIRBENCH[0]}-{AIRBENCH[1]}-*.whl"))), None)


def prepare() -> int:
    """Fill .gpu/ with one pinned wheel per CARRIED name, airbench's, and the tarball, within
    TRAVEL_LIMIT; print the size that travels."""
    from importlib import metadata

    from accel.shared_data import SHA256, sha256
    from accel.shared_data import TARBALL as SHARED

    try:
        pins = [f"{name}=={metadata.version(name)}" for name in CARRIED]
    except metadata.PackageNotFoundError as e:
        return fail(f"{e.name} is not installed in this interpreter: run with .venv/bin/python")
    fresh = GPU_DIR / "wheels.new"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip"]
    download = [*pip, "download", "-q", "--disable-pip-version-check", "--no-deps",
                "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
                *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(fresh), *pins]
    if subprocess.run(download).returncode != 0:
        return fail("pip download failed (its message is above)")
    build = [*pip, "wheel", "-q", "--disable-pip-version-check", "--no-deps",
             "--no-binary", AIRBENCH[0], "-w", str(fresh), "==".join(AIRBENCH)]
    if subprocess.run(build).returncode != 0:
        return fail(f"building the {'=='.join(AIRBENCH)} wheel failed (its message is above)")
    problem = wheel_problem(fresh)
    if problem:
        return fail(problem)
    shutil.rmtree(WHEELS, ignore_errors=True)
    fresh.rename(WHEELS)  # never a mix of old and new versions: two of one name stop the install
    if not TARBALL.exists() or sha256(TARBALL) != SHA256:
        if sha256(SHARED) != SHA256:
            return fail(f"{SHARED}: sha256 differs from {SHA256}")
        shutil.copyfile(SHARED, TARBALL)
    wheels = sum(p.stat().st_size for p in WHEELS.glob("*.whl"))
    print(f"{len(expected())} wheels (airbench's built here): {mib(wheels)}; "
          f"{TARBALL.name}: {mib(TARBALL.stat().st_size)}")
    tree, carried = travel_bytes()
    print(f"travels: working tree {mib(tree)} + .gpu {mib(carried)} = {mib(tree + carried)} "
          f"of {mib(TRAVEL_LIMIT)}")
    if tree + carried > TRAVEL_LIMIT:
        return fail(f"working tree + .gpu = {mib(tree + carried)}, over {mib(TRAVEL_LIMIT)}")
    return 0


def wheel_problem(folder: Path) -> str | None:
    """None when `folder` holds exactly one wheel for each expected name, else what is wrong."""
    found = [norm(p.name.split("-")[0]) for p in folder.glob("*.whl")]
    missing = sorted(expected() - set(found))
    extra = sorted(set(found) - expected())
    twice = sorted({n for n in found if found.count(n) > 1})
    if missing or extra or twice:
        return (f"{folder}: wheels missing {missing or '-'}, unexpected {extra or '-'}, "
                f"more than one version of {twice or '-'} (run `make gpu-wheels`)")
    return None


def travel_bytes() -> tuple[int, int]:
    """(the working tree that travels: tracked + untracked-not-ignored files, .gpu's files)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tree = sum(p.lstat().st_size for p in (ROOT / f for f in set(listed.split("\0")) if f)
               if p.is_file() or p.is_symlink())
    carried = sum(p.stat().st_size for p in GPU_DIR.rglob("*") if p.is_file())
    return tree, carried
