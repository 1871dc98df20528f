"""What the tracking server's login costs a request: the same calls against a server without a
login, with one that checks every request's password, and with one that trusts a check for 60 s
(accel.tracking.auth's default), side by side.

    .venv/bin/python bench/auth_overhead.py [--calls 60] [--rounds 2]

Each configuration is a fresh native stack (bench/stack_capacity.py's NativeStack: PostgreSQL at
127.0.0.1:5432, trust auth, databases made and dropped here; the server's default 4 workers,
each with its own cache of checked passwords). Per round and configuration: --calls `log_metric`
calls and --calls `log_batch` calls of 8 metrics (an epoch's log) through MLflow's client, as
the admin where there is a login; the median latency of each. Rounds alternate the configurations.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stack_capacity import ADMIN_PASSWORD, NativeStack  # noqa: E402

CONFIGURATIONS = {"no login": None, "login, every request checked": 0,
                  "login, a check trusted 60 s": 60}


def measure(stack: NativeStack, calls: int, login: bool) -> dict[str, float]:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if login:
        os.environ.update(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=ADMIN_PASSWORD)
    else:
        for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            os.environ.pop(name, None)
    client = MlflowClient(stack.tracking_uri)
    run = client.create_run(client.create_experiment("overhead")).info.run_id
    single, batch = [], []
    for i in range(calls):
        start = time.perf_counter()
        client.log_metric(run, "m", float(i), step=i)
        single.append(time.perf_counter() - start)
        metrics = [Metric(f"m{k}", float(i), int(time.time() * 1000), i) for k in range(8)]
        start = time.perf_counter()
        client.log_batch(run, metrics=metrics, synchronous=True)
        batch.append(time.perf_counter() - start)
    return {"log_metric": statistics.median(single) * 1000,
            "log_batch": statistics.median(batch) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGURATIONS}
    for _ in range(args.rounds):
        for name, ttl in CONFIGURATIONS.items():
            with NativeStack(args.postgres, login_ttl_s=ttl) as stack:
                results[name].append(measure(stack, args.calls, ttl is not None))
    base = results["no login"]
    print("| server | log_metric median ms (per round) | log_batch of 8 median ms | "
          "log_batch vs no login |")
    print("| --- | --- | --- | --- |")
    for name, rows in results.items():
        single = " / ".join(f"{r['log_metric']:.1f}" for r in rows)
        batch = " / ".join(f"{r['log_batch']:.1f}" for r in rows)
        ratios = [r["log_batch"] / b["log_batch"] for r, b in zip(rows, base, strict=True)]
        print(f"| {name} | {single} | {batch} | {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}..{max(ratios):.2f}) |")
    load = os.getloadavg()
    print(f"{args.rounds} rounds x {args.calls} calls; load average {load[0]:.2f}, "
          f"{os.cpu_count()} cores")


if __name__ == "__main__":
    main()
