"""Scale-out: trials per minute with 1 vs 2 nodes through an MLflow server on PostgreSQL, and what
the server store costs per trial against a local SQLite store, side by side.

Each round runs, in alternation, the same study three ways (fresh databases and stores each):
  sqlite   1 node,  journal file + local SQLite MLflow store
  server   1 node,  PostgreSQL Optuna storage + `mlflow server` (PostgreSQL backend)
  server2  2 nodes, the same, each node running half of the trials
Every node is a real `accel tune` process with one torch thread. Trials per minute count the
whole study's wall time (process start-up included); the per-trial cost of the server is the
difference of the median trial durations (Optuna's, start-up excluded) of `server` and `sqlite`.

    .venv/bin/python bench/scale_out.py [--trials 6] [--rounds 2] [KEY=VALUE ...]

Needs PostgreSQL at 127.0.0.1:5432 (trust auth). Defaults: the quickstart, 2 epochs, no pruning.
Goals: server2 / server >= 1.7 (trials per minute); server - sqlite <= 1 s per trial.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import print_ratio  # noqa: E402

PG = "postgresql+psycopg2://postgres@127.0.0.1:5432/"


MADE: list[str] = []  # databases this run created, dropped at the end


def new_database(admin) -> str:
    name = f"accel_bench_{uuid.uuid4().hex[:8]}"
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    MADE.append(name)
    return name


def start_server(folder: Path, backend: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": backend,
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--artifacts-destination", str(folder / "artifacts")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(180):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            return proc, url
        except OSError:
            time.sleep(1)
    raise RuntimeError("mlflow server did not start")


def run_study(nodes: int, trials: int, storage: str, uri: str, items: list[str]) -> float:
    """Wall seconds for `nodes` accel tune processes sharing `trials` trials of one study."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": uri}
    argv = [sys.executable, "-m", "accel", "tune", "experiments/quickstart.yaml", *items,
            "--study", "bench", "--storage", storage]
    started = time.perf_counter()
    procs = [subprocess.Popen([*argv, "--n-trials", str(trials // nodes)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(nodes)]
    if any(p.wait() != 0 for p in procs):
        from accel.uris import redact

        raise RuntimeError(f"accel tune failed ({nodes} node(s), storage {redact(storage)})")
    return time.perf_counter() - started


def trial_seconds(storage: str) -> list[float]:
    import optuna

    from accel.tune import open_storage

    study = optuna.load_study(study_name="bench", storage=open_storage(storage))
    return [t.duration.total_seconds() for t in study.trials if t.duration]


def one_round(admin, trials: int, items: list[str]) -> dict[str, tuple[float, list[float]]]:
    out = {}
    with tempfile.TemporaryDirectory(prefix="accel-bench-") as tmp:
        folder = Path(tmp)
        journal, sqlite = str(folder / "optuna.journal"), f"sqlite:///{folder / 'mlflow.db'}"
        out["sqlite"] = (run_study(1, trials, journal, sqlite, items), trial_seconds(journal))
        for name, nodes in (("server", 1), ("server2", 2)):
            server, url = start_server(folder / name, PG + new_database(admin))
            storage = PG + new_database(admin)
            try:
                out[name] = (run_study(nodes, trials, storage, url, items),
                             trial_seconds(storage))
            finally:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait()
    return out


def main() -> None:
    import psycopg2

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("items", nargs="*", metavar="KEY=VALUE")
    ap.add_argument("--trials", type=int, default=6, help="trials per study (even)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    items = ["train.epochs=2", "search.pruner=none", *args.items]
    admin = psycopg2.connect(host="127.0.0.1", user="postgres", dbname="postgres")
    admin.autocommit = True
    walls: dict[str, list[float]] = {"sqlite": [], "server": [], "server2": []}
    durations: dict[str, list[float]] = {"sqlite": [], "server": [], "server2": []}
    try:
        for r in range(args.rounds):
            for name, (wall, seconds) in one_round(admin, args.trials, items).items():
                walls[name].append(wall)
                durations[name] += seconds
                print(f"round {r + 1} {name:8s} {wall:6.1f} s for {args.trials} trials "
                      f"({60 * args.trials / wall:5.2f} trials/min), median trial "
                      f"{statistics.median(seconds):5.2f} s", flush=True)
    finally:
        with admin.cursor() as cur:
            for name in MADE:
                cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    added = statistics.median(durations["server"]) - statistics.median(durations["sqlite"])
    print(f"server store vs local SQLite: {added:+.2f} s per trial (median trial duration)")
    # Same trials in less wall time: trials/min ratio = wall(server) / wall(server2).
    print_ratio(walls, "server", "server2", "2 nodes vs 1 node, trials per minute", ".2f")


if __name__ == "__main__":
    main()
