"""`make docker-check`: the docker/ stack built and run, checked from the host, then removed.

    .venv/bin/python -m checks.docker [--trials 6] [--rebuild] [--extra-ca FILE]

1. A docker daemon: the running one, else `dockerd` started here (its own process group, stopped
   at the end with everything it started).
2. Base images: `python:3.11-slim` and `postgres:17` are used when present; where no registry can
   be reached, stand-ins are made from Debian bookworm's packages (debootstrap) and tagged with
   those names, so docker/compose.yaml is used unchanged. The postgres stand-in's entrypoint is
   docker/standin/postgres-entrypoint.sh (POSTGRES_USER/PASSWORD/DB, /docker-entrypoint-initdb.d,
   pg_isready).
3. The image: `docker build -f docker/Dockerfile -t accel:cpu --network host`, with the host's
   extra CA certificates (/usr/local/share/ca-certificates/*.crt, or --extra-ca) as EXTRA_CA_CERT.
4. The stack (project `accel`, credentials from docker/.env; made from .env.example with random
   passwords when absent and removed again): db + mlflow (its login refuses an anonymous
   request), the workers' account, then three studies on the quickstart:
   1 worker, 2 workers (`--scale worker=2`), 2 workers with one container killed mid-trial.
   From the host, through the MLflow server on 127.0.0.1:5000: one parent run, one child run per
   trial, artifacts served as `mlflow-artifacts:`; in a worker container: `accel best --register`
   and `accel reproduce` of the best trial (exact), the killed worker's trial FAIL and retried
   with the same values by the other worker.
5. `down -v`: no container, network or volume of the project left; the table; exit 1 on any
   failed check.

Workers run with one torch thread, heartbeat 2 s and grace 10 s (a compose override made here),
so that a killed worker's trial is retried within the study.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from checks.docker.checks import (
    check_best_and_reproduce,
    check_retry,
    check_runs,
    leftovers,
    throughput,
)
from checks.docker.machine import Check
from checks.docker.settings import ENV_FILE, log


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m checks.docker",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=6, help="trials per worker (default 6)")
    parser.add_argument("--rebuild", action="store_true", help="build the image without cache")
    parser.add_argument("--extra-ca", help="PEM file of CA certificates for the image build "
                        "(default: /usr/local/share/ca-certificates/*.crt)")
    args = parser.parse_args()
    if not shutil.which("docker"):
        print("docker-check needs docker (apt-get install docker.io docker-compose "
              "debootstrap; root starts dockerd)", file=sys.stderr)
        return 2
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    work = Path(tempfile.mkdtemp(prefix="accel-docker-check-"))
    check = Check(args, work)
    started = time.perf_counter()
    up = False
    try:
        check.ensure_daemon()
        log(f"compose: {' '.join(check.compose_cmd)}; logs in {work}")
        check.dotenv()
        check.base_images()
        check.build()
        up = True
        check.start_stack()
        one = check.study("dc-1worker", 1, args.trials)
        throughput(check, "dc-1worker", 1, one)
        two = check.study("dc-2workers", 2, args.trials)
        throughput(check, "dc-2workers", 2, two)
        check_runs(check, "dc-2workers", two["trials"])
        check_best_and_reproduce(check, "dc-2workers")
        kill = check.study("dc-kill", 2, args.trials + 4, kill=True)
        check_retry(check, "dc-kill", kill["trials"])
    except Exception as exc:  # noqa: BLE001 - reported as a failed check, then cleaned up
        check.expect(False, "the check ran to its end", str(exc))
    finally:
        if up:
            check.compose("down", "-v", "--remove-orphans", check=False)
            left = leftovers(check)
            check.expect(not left, "down -v left no container, network or volume", str(left))
        if check.made_env:
            ENV_FILE.unlink()
        check.stop_daemon()
        if not check.failed:
            shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    print(f"\nmake docker-check: {time.perf_counter() - started:.0f} s in all, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores")
    print("| measure | value |\n| --- | --- |")
    for what, value in check.rows:
        print(f"| {what} | {value} |")
    if check.failed:
        print(f"\n{len(check.failed)} check(s) failed: " + "; ".join(check.failed))
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
