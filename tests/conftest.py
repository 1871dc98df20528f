"""Shared fixtures: tiny configs on CPU and a throwaway MLflow store per test."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"

# `make test` runs the suite in two pytest-xdist processes on a 2-core machine: each, and every
# `accel` it starts, uses one OpenMP thread (two spinning threads each would fight for the cores).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# The files whose tests start real processes (signals, workers, servers, outages) go first: two
# pytest-xdist processes each take a whole file at a time, in this order (the Makefile turns
# xdist's own order, files with the most tests first, off), and a costly file left for last
# keeps one process busy while the other has nothing left. Roughly by cost, most first; the rest
# keep their order.
COSTLY_FIRST = ("test_study_signals.py", "test_worker_faults.py", "test_store_outages.py",
                "test_resume.py", "test_search.py", "test_signals.py", "test_distributed.py",
                "test_train.py", "test_registry.py", "test_ablation.py", "test_verify.py",
                "test_study_record.py", "test_cli.py", "test_ui.py", "test_report.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(COSTLY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# train.amp=auto's answers (accel.train.amp_probe) go to a cache of the suite's own: a probe timed
# while the suite loads the machine must not decide the user's runs.
os.environ.setdefault("ACCEL_CACHE_DIR", str(Path(tempfile.gettempdir()) / "accel-test-cache"))


_EMPTY_STORE: list[Path] = []  # this process's empty store, made once


def _empty_store() -> Path:
    """An empty SQLite MLflow store (its tables made by MLflow's own migrations, ~2.5 s), made
    once per test process and copied for each store a test makes."""
    if not _EMPTY_STORE:
        import atexit
        import shutil

        from mlflow.tracking import MlflowClient

        folder = tempfile.mkdtemp(prefix="accel-empty-store-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        db = Path(folder) / "mlflow.db"
        MlflowClient(f"sqlite:///{db}").search_experiments()
        _EMPTY_STORE.append(db)
    return _EMPTY_STORE[0]


def new_store(folder: Path) -> str:
    """An MLflow store made before a child process starts: a test that polls the store while the
    child runs would otherwise create a fresh store's tables at the same time as the child. A
    copy of an empty store made by MLflow (the tables and their migration version as MLflow
    makes them), without repeating the migrations for every test."""
    import shutil

    (folder / "mlruns").mkdir(parents=True, exist_ok=True)
    db = folder / "mlruns" / "mlflow.db"
    shutil.copyfile(_empty_store(), db)
    return f"sqlite:///{db}"


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A fresh SQLite MLflow store for one test, its tables made."""
    return new_store(tmp_path)


# A few-second run on digits: tiny timm model, few iterations, CPU, fp32, no figures (about a
# second of drawing a run: tests/test_train.py's contract test draws them).
TINY_OVERRIDES = (
    "tracking.figures=false",
    "data.dataset=digits",
    "model.name=test_resnet",
    "model.img_size=16",
    "train.epochs=2",
    "train.epoch_length=6",
    "train.batch_size=16",
    "train.device=cpu",
    "train.amp=off",
    "data.num_workers=0",
)


@pytest.fixture
def tiny_overrides() -> list[str]:
    """A few-second run on digits: tiny timm model, few iterations, CPU, fp32."""
    return list(TINY_OVERRIDES)  # module-scoped fixtures import the tuple directly


def run_cli(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: int = 300):
    """The real `accel` entry point in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MLFLOW_TRACKING_URI", None) if env is None else None
    return subprocess.run(
        [sys.executable, "-m", "accel", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


def stop_group(proc: subprocess.Popen, wait_s: float = 30) -> None:
    """SIGTERM to the process group a test started (its own session), SIGKILL if it lingers."""
    import signal

    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def make_imagefolder(root: Path, *, side: int, classes: int, per_class: dict[str, int],
                     gray: bool = False) -> Path:
    """A generated ImageFolder tree: root/<split>/class<c>/<i>.png of random pixels."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    shape = (side, side) if gray else (side, side, 3)
    for split, n in per_class.items():
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, shape, dtype=np.uint8)
                Image.fromarray(pixels, mode="L" if gray else "RGB").save(folder / f"{i}.png")
    return root


@pytest.fixture(scope="session")
def tiny_imagefolder(tmp_path_factory) -> Path:
    """A generated ImageFolder tree (train/ and test/, 10 classes, 32x32 PNGs) for image configs."""
    return make_imagefolder(tmp_path_factory.mktemp("imagefolder"), side=32, classes=10,
                            per_class={"train": 6, "test": 2})


@pytest.fixture
def postgres_databases():
    """Makes fresh databases on the local PostgreSQL (127.0.0.1:5432, trust auth); all of them
    are dropped afterwards. Skips when the server is down, but fails under CI=true."""
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        admin = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres",
                                 connect_timeout=3)
    except psycopg2.OperationalError as e:
        message = f"PostgreSQL is not reachable at 127.0.0.1:5432: {e}".strip()
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true, so a missing service must not pass as a skip")
        pytest.skip(message)
    admin.autocommit = True
    made: list[str] = []

    def new(create: bool = True) -> str:
        """A fresh database's name; with create=False only the name (made by the code under
        test), dropped all the same."""
        name = f"accel_test_{uuid.uuid4().hex[:10]}"
        if create:
            with admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return name

    try:
        yield new
    finally:
        with admin.cursor() as cur:
            for name in made:
                cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


@pytest.fixture
def postgres_url(postgres_databases) -> str:
    """A fresh database's URL (no password: trust auth)."""
    return f"postgresql://postgres@127.0.0.1:5432/{postgres_databases()}"


def cli_main(*args: str) -> tuple[int, str, str]:
    """`accel ARGS` in this process, through `accel.cli.main` with real argv: (exit code, stdout,
    stderr). For tests where the process boundary is not what is tested: no ~6.5 s of imports.
    Runs in the repository root, as `run_cli` does, and leaves the environment as it found it
    (a command may set MLFLOW_TRACKING_URI for a password-bearing store)."""
    import contextlib
    import io

    from accel import cli

    out, err = io.StringIO(), io.StringIO()
    environ = dict(os.environ)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(environ)
    return code, out.getvalue(), err.getvalue()


def run_in_process(*args: str) -> subprocess.CompletedProcess:
    """`run_cli`'s result (returncode, stdout, stderr) from `cli_main`: for a test that reads a
    command's output and exit code, not its process."""
    code, out, err = cli_main(*args)
    return subprocess.CompletedProcess(["accel", *args], code, out, err)


def register_tiny_model(tmp: Path, name: str, alias: str = "champion") -> tuple[str, str]:
    """A one-trial accel_cnn_s study on digits at 8 px (the quickstart's network and size), its
    trial registered as NAME@ALIAS with `accel best --register`: (store URI, the trial's run)."""
    import re

    import yaml

    exp = tmp / "s.yaml"
    exp.write_text(yaml.safe_dump({"search": {"pruner": "none", "space": {
        "train.lr": {"type": "float", "low": 5.0e-3, "high": 7.0e-3}}}}))
    store = f"sqlite:///{tmp / 'mlruns' / 'mlflow.db'}"
    where = ["--storage", str(tmp / "optuna.journal"), "--tracking-uri", store]
    # 20 updates an epoch: a model that learns (6 stay at chance, which --register refuses)
    tiny = [*TINY_OVERRIDES, "model.name=accel_cnn_s", "model.img_size=8",
            "train.epoch_length=20", "tracking.system_metrics=false"]
    tune = run_in_process("tune", str(exp), *tiny, "--study", "s", "--n-trials", "1", *where)
    assert tune.returncode == 0, tune.stderr[-2000:]
    best = run_in_process("best", "--study", "s", "--register", name, "--alias", alias, *where)
    assert best.returncode == 0, best.stderr[-2000:]
    return store, re.search(r"mlflow run: ([0-9a-f]{32})", best.stdout).group(1)
