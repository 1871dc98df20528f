"""How many workers one MLflow server + PostgreSQL carries: simulated workers, 1, 2, 4 ... 32.

Each simulated worker is a process that makes the calls a trial of `accel tune` makes, through
accel's own code (accel.tune.storage.open_storage, accel.tracking.Tracker), with the training
replaced by a sleep of --epoch-s seconds:
  per trial  study.ask, a child run of the study's parent run (tags), log_config (the whole
             config as params + config.yaml), then the epochs, then the state tag, end_run,
             study.tell;
  per epoch  the sleep, log_metrics (8 metrics, one batch), a checkpoint of --checkpoint-kb KB
             uploaded as an artifact, the Optuna heartbeat, trial.report, trial.should_prune.
Per worker count it runs --seconds seconds and measures trials per minute, epochs per second and
the p50/p95 latency of a log_metrics call; the offered load is workers / epoch-s epochs per
second. It stops early once a doubling of workers adds less than 10 % throughput (saturated).

    .venv/bin/python bench/stack_capacity.py [--max-workers 32] [--seconds 30] [--epoch-s 0.5]

Without --tracking-uri/--storage it starts the stack natively: databases on the PostgreSQL at
127.0.0.1:5432 (trust auth; created and dropped here) and an `mlflow server` on them (the
command of docker/compose.yaml's mlflow service, without its login), in its own process group,
stopped at the end.
With them (e.g. the docker stack: --tracking-uri http://127.0.0.1:5000 and a published
PostgreSQL), it uses that stack. A GPU worker logging one epoch every T seconds offers 1/T
epochs per second: the server carries about (saturated epochs per second) * T such workers.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
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
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METRICS = ("train_loss", "val_loss", "val_accuracy", "val_f1", "epoch_time_s",
           "train_throughput", "lr", "peak_memory_mb")


def worker_counts(max_workers: int) -> list[int]:
    counts, n = [], 1
    while n <= max_workers:
        counts.append(n)
        n *= 2
    return counts


def saturated(rates: list[float], gain: float = 1.1) -> bool:
    """True once the last doubling of workers added less than 10 % throughput."""
    return len(rates) >= 2 and rates[-1] < gain * rates[-2]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def simulated_worker(args, storage_url: str, tracking_uri: str, study_name: str,
                     parent_run_id: str, deadline: float, out) -> None:
    """One worker: trials until the deadline; sends (trials, epochs, latencies) back."""
    import optuna

    from accel import config
    from accel.tracking import Tracker
    from accel.tune.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The heartbeat is recorded by hand per epoch, as Study.optimize's thread would.
    warnings.filterwarnings("ignore", message="Heartbeat of storage")
    cfg = config.load(ROOT / "experiments" / "quickstart.yaml")
    tracker = Tracker(tracking_uri)
    storage = open_storage(storage_url)
    study = optuna.load_study(study_name=study_name, storage=storage)
    experiment = study_name
    checkpoint = Path(tempfile.mkdtemp()) / "last-a.pt"
    checkpoint.write_bytes(os.urandom(args.checkpoint_kb * 1024))
    trials, epochs, latencies = 0, 0, []
    while time.time() < deadline:
        trial = study.ask()
        x = trial.suggest_float("train.lr", 3e-4, 3e-2, log=True)
        run_id = tracker.start_run(experiment, f"trial-{trial.number:03d}", tags={
            "accel.role": "trial", "accel.study": study_name,
            "optuna.trial_number": str(trial.number)}, parent_run_id=parent_run_id)
        tracker.log_config(run_id, cfg)
        for epoch in range(1, args.epochs + 1):
            time.sleep(args.epoch_s)  # the training of one epoch
            values = {name: x * epoch for name in METRICS}
            start = time.perf_counter()
            tracker.log_metrics(run_id, values, step=epoch)
            latencies.append(time.perf_counter() - start)
            tracker.log_artifact(run_id, checkpoint, "checkpoint")
            storage.record_heartbeat(trial._trial_id)
            trial.report(values["val_accuracy"], epoch)
            trial.should_prune()
            epochs += 1
        tracker.set_tags(run_id, {"optuna.trial_state": "COMPLETE"})
        tracker.end_run(run_id, "FINISHED")
        study.tell(trial, x)
        trials += 1
    out.put((trials, epochs, latencies))


def measure(args, n: int, storage_url: str, tracking_uri: str) -> dict:
    """One level: n simulated workers on a study of their own for args.seconds."""
    import optuna

    from accel.tracking import Tracker
    from accel.tune.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = f"capacity-{n}-{uuid.uuid4().hex[:6]}"
    optuna.create_study(study_name=name, storage=open_storage(storage_url), direction="maximize")
    tracker = Tracker(tracking_uri)
    parent = tracker.start_run(name, "study", tags={"accel.role": "study", "accel.study": name})
    ctx = mp.get_context("fork")  # children share the imported libraries' pages
    out = ctx.Queue()
    start = time.time()
    deadline = start + args.seconds
    procs = [ctx.Process(target=simulated_worker, args=(args, storage_url, tracking_uri, name,
                                                        parent, deadline, out))
             for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=args.seconds + 600) for _ in procs]
    for p in procs:
        p.join()
    wall = time.time() - start  # each worker finishes the trial it is in past the deadline
    tracker.end_run(parent, "FINISHED")
    latencies = [x for _, _, lat in results for x in lat]
    trials, epochs = sum(r[0] for r in results), sum(r[1] for r in results)
    return {"workers": n, "trials_per_min": 60 * trials / wall, "epochs_per_s": epochs / wall,
            "offered": n / args.epoch_s, "p50_ms": 1000 * percentile(latencies, 0.5),
            "p95_ms": 1000 * percentile(latencies, 0.95), "trials": trials}


# --- the native stack -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ADMIN_PASSWORD = "bench-admin-passw0rd"  # a throwaway server's login (bench/auth_overhead.py)


class NativeStack:
    """Two fresh PostgreSQL databases and an `mlflow server` on them, removed on exit. With
    `login_ttl_s` (not None) the server is docker/compose.yaml's, with its login (a third
    database holds the users; a password check is trusted that many seconds)."""

    def __init__(self, pg: str, login_ttl_s: int | None = None):
        self.pg, self.suffix = pg, uuid.uuid4().hex[:8]
        self.dbs = [f"capacity_mlflow_{self.suffix}", f"capacity_optuna_{self.suffix}"]
        self.login_ttl_s = login_ttl_s
        if login_ttl_s is not None:
            self.dbs.append(f"capacity_auth_{self.suffix}")
        self.tmp = Path(tempfile.mkdtemp(prefix="stack-capacity-"))
        self.server: subprocess.Popen | None = None

    def _admin(self, sql: str) -> None:
        import psycopg2

        conn = psycopg2.connect(f"{self.pg}/postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql)
        conn.close()

    def __enter__(self):
        try:
            return self._start()
        except BaseException:
            self.__exit__()  # what was made before the failure goes too
            raise

    def _start(self):
        for db in self.dbs:
            self._admin(f'CREATE DATABASE "{db}"')
        port = free_port()
        self.tracking_uri = f"http://127.0.0.1:{port}"
        self.storage_url = f"{self.pg}/{self.dbs[1]}"
        backend = f"{self.pg}/{self.dbs[0]}".replace("postgresql://", "postgresql+psycopg2://")
        env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": backend,
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        server = [sys.executable, "-m", "mlflow", "server"]
        if self.login_ttl_s is not None:
            server = [sys.executable, "-m", "accel.tracking.auth", "serve"]
            env.update(ACCEL_AUTH_DATABASE_URI=f"{self.pg}/{self.dbs[2]}",
                       MLFLOW_AUTH_ADMIN_PASSWORD=ADMIN_PASSWORD,
                       ACCEL_AUTH_CACHE_TTL_S=str(self.login_ttl_s))
        log = (self.tmp / "mlflow.log").open("w")
        self.server = subprocess.Popen(
            [*server, "--host", "127.0.0.1", "--port", str(port),
             "--artifacts-destination", str(self.tmp / "artifacts"), "--allowed-hosts",
             "localhost,localhost:*,127.0.0.1,127.0.0.1:*"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(f"{self.tracking_uri}/health", timeout=2).close()
                return self
            except OSError:
                if self.server.poll() is not None or time.time() > deadline:
                    raise RuntimeError("mlflow server did not start: "
                                       + (self.tmp / "mlflow.log").read_text()[-2000:]) from None
                time.sleep(1)

    def __exit__(self, *exc):
        if self.server and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()
        for db in self.dbs:
            self._admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        subprocess.run(["rm", "-rf", str(self.tmp)], check=False)


def run(args) -> list[dict]:
    rows: list[dict] = []
    print("| workers | offered epochs/s | epochs/s | trials/min | log_metrics p50 ms | p95 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in worker_counts(args.max_workers):
        row = measure(args, n, args.storage, args.tracking_uri)
        rows.append(row)
        print(f"| {n} | {row['offered']:.1f} | {row['epochs_per_s']:.1f} | "
              f"{row['trials_per_min']:.1f} | {row['p50_ms']:.0f} | {row['p95_ms']:.0f} |",
              flush=True)
        if saturated([r["epochs_per_s"] for r in rows]):
            print(f"saturated: {n} workers add less than 10 % over {n // 2}")
            break
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-workers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30.0, help="per worker count")
    parser.add_argument("--epoch-s", type=float, default=0.5, help="simulated epoch (sleep)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per trial")
    parser.add_argument("--checkpoint-kb", type=int, default=64, help="checkpoint per epoch")
    parser.add_argument("--tracking-uri", help="an MLflow server (default: start one)")
    parser.add_argument("--storage", help="a PostgreSQL Optuna storage URL")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432",
                        help="PostgreSQL for the native stack (trust auth)")
    args = parser.parse_args(argv)
    # As `accel` does: no "View run at" lines on stdout for every run a server ends.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    load = os.getloadavg()
    print(f"stack_capacity: {args.seconds:.0f} s per level, epoch {args.epoch_s} s, "
          f"{args.epochs} epochs/trial, checkpoint {args.checkpoint_kb} KB; {os.cpu_count()} "
          f"cores, load average {load[0]:.2f} at start", flush=True)
    if args.tracking_uri and args.storage:
        return run(args)
    with NativeStack(args.postgres) as stack:
        args.tracking_uri, args.storage = stack.tracking_uri, stack.storage_url
        rows = run(args)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end; "
          f"median p50 {statistics.median(r['p50_ms'] for r in rows):.0f} ms")
    return rows


if __name__ == "__main__":
    main()
