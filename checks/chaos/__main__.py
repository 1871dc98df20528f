"""Faults at random under a running study, then a calm invocation, then what was lost.

    python -m checks.chaos --seconds 300 --seed 0

A study of short trials runs as `accel tune --workers 2` against its own PostgreSQL (a cluster in
a scratch folder, on its own port: checks/chaos/services.py) and its own `mlflow server` backed by
it. For `--seconds`, faults of every kind land at seeded random times, each kind at least twice:
a worker process SIGKILLed; a worker frozen (SIGSTOP) past the heartbeat grace period while
another node starts on the study, then continued (a long GC pause, a swapped-out process, a VM
frozen for a live migration); the whole
invocation SIGKILLed (and started again); the invocation SIGTERMed (a preemption, a time limit;
started again); the MLflow server restarted; PostgreSQL restarted (fast shutdown: connections
ended); PostgreSQL killed (SIGKILL to all its processes, then started: crash recovery). An
invocation that ends is started again. Then a calm invocation runs what is queued, and
`accel best` answers.

It prints the figures: faults by kind, every invocation's exit code, the trials by state,
retried, lost (a FAIL trial neither retried nor past its retry limit), runs left RUNNING, runs
per trial, the parent run's status, and the invocations whose output holds a traceback. Exit 0
when nothing was lost, nothing is RUNNING, every trial has exactly one run, the parent is
FINISHED and no output holds a traceback; else 1. Everything it starts is stopped and its
scratch removed, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from checks.chaos.faults import Chaos, plan
from checks.chaos.tally import figures, report


def _stop(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checks.chaos",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logs", type=Path, help="a folder to keep the invocations' output in")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)  # stopped from outside: still stop what it started
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="accel-chaos-") as tmp:
        chaos = Chaos(Path(tmp), args.seed)
        try:
            began = time.time()
            for at, kind in plan(args.seconds, args.seed):
                while time.time() - began < at:
                    chaos.keep_running()
                    time.sleep(0.5)
                print(f"[{time.time() - began:5.0f} s] {kind}", flush=True)
                chaos.keep_running()
                chaos.inject(kind)
            while time.time() - began < args.seconds:
                chaos.keep_running()
                time.sleep(0.5)
            chaos.calm()
            ok = report(chaos, figures(chaos), args.seconds, args.seed, time.time() - start)
        finally:
            chaos.close()
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, args.logs / log.name)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
