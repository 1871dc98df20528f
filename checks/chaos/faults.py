"""The chaos check's study and the faults done to it: its own PostgreSQL and `mlflow server`
(services.py), `accel tune` invocations kept running, and each kind of fault injected into them
at its planned time."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

from accel.uris import with_driver
from checks.chaos.services import LocalPostgres, MlflowServer
from checks.common import ROOT

KINDS = ("worker SIGKILL", "worker frozen", "invocation SIGKILL", "invocation SIGTERM",
         "MLflow server restart", "PostgreSQL restart", "PostgreSQL SIGKILL")
STUDY = "chaos"
CONFIG = {
    "name": STUDY,
    "data": {"dataset": "digits", "num_workers": 0},
    "model": {"name": "test_resnet", "img_size": 16},
    "train": {"epochs": 4, "epoch_length": 8, "batch_size": 16, "device": "cpu", "amp": "off"},
    "search": {"pruner": "none", "space": {
        "train.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}}},
}
# Dead trials are found within seconds: heartbeats every 2 s, stale after 8 s.
ENV = {"ACCEL_HEARTBEAT_S": "2", "ACCEL_GRACE_S": "8"}


def plan(seconds: float, seed: int, per_kind: int = 2, extra: int = 7) -> list[tuple[float, str]]:
    """(time, kind) of each fault: every kind `per_kind` times and `extra` more at random, at
    seeded random times over the middle of the run (not in its first or last tenth)."""
    rng = random.Random(seed)
    kinds = [k for k in KINDS for _ in range(per_kind)] + rng.choices(KINDS, k=extra)
    rng.shuffle(kinds)
    times = sorted(rng.uniform(0.1, 0.9) * seconds for _ in kinds)
    return list(zip(times, kinds, strict=True))


class Chaos:
    """The study's stores and its invocations, and the faults done to them."""

    def __init__(self, scratch: Path, seed: int):
        self.scratch, self.rng = scratch, random.Random(seed + 1)
        self.pg = LocalPostgres()
        self.server = None
        try:
            self.pg.start()
            self.storage = self.pg.create_database("optuna")
            self.server = MlflowServer(scratch, with_driver(self.pg.create_database("mlflow")))
            self.server.start()
        except BaseException:
            self.close()
            raise
        self.config = scratch / "chaos.yaml"
        self.config.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
        self.proc: subprocess.Popen | None = None
        # (how the invocation was ended, its exit code, its last line where the code is not 0)
        self.exits: list[tuple[str, int, str]] = []
        self.faults: Counter = Counter()
        self.tracebacks: list[str] = []  # the logs of invocations that printed one
        self.lost_leases = 0  # trials a worker came back to after another failed them as stale

    def tune(self, *args: str, log: str | None = None) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ACCEL_"))}
        log = (self.scratch / f"{log or f'tune-{len(self.exits)}'}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "accel", "tune", str(self.config), "--study", STUDY,
             "--storage", self.storage, "--tracking-uri", self.server.url, *args],
            cwd=ROOT, env={**env, **ENV}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        proc.log = Path(log.name)
        return proc

    def _ended(self, how: str, proc: subprocess.Popen) -> None:
        text = proc.log.read_text(errors="replace")
        lines = text.strip().splitlines()
        last = lines[-1][:160] if lines and proc.returncode not in (0, 143) else ""
        self.exits.append((how, proc.returncode, last))
        if "Traceback" in text:
            self.tracebacks.append(f"{proc.log.name} ({how})")
        self.lost_leases += text.count(" left to its retry")

    def keep_running(self) -> None:
        """An invocation of 4 trials on 2 workers is always running; one that ended is noted."""
        if self.proc is not None and self.proc.poll() is not None:
            self._ended("ended", self.proc)
            self.proc = None
        if self.proc is None:
            self.proc = self.tune("--n-trials", "4", "--workers", "2")

    def inject(self, kind: str) -> None:
        self.faults[kind] += 1
        if kind.startswith("worker"):
            deadline = time.time() + 60  # an invocation setting up has no worker yet
            while not (workers := self._workers()) and time.time() < deadline:
                self.keep_running()
                time.sleep(0.5)
            if not workers:
                self.faults[kind] -= 1  # not injected: not counted
                return
            if kind == "worker SIGKILL":
                os.kill(self.rng.choice(workers), signal.SIGKILL)
                return
            training = self._training(workers)  # frozen inside a trial, not between two
            if not training:
                self.faults[kind] -= 1
                return
            self._freeze(self.rng.choice(training))
        elif kind.startswith("invocation"):
            sig = signal.SIGKILL if kind.endswith("SIGKILL") else signal.SIGTERM
            self._end(sig, kind.split()[-1])
        elif kind == "MLflow server restart":
            self.server.stop()
            time.sleep(self.rng.uniform(1, 8))
            self.server.start()
        else:
            if kind == "PostgreSQL SIGKILL":
                self.pg.kill()
            else:
                self.pg.stop("fast")
            time.sleep(self.rng.uniform(1, 8))
            self.pg.start()

    def _freeze(self, worker: int) -> None:
        """SIGSTOP past the grace period; meanwhile another node starts on the study (an
        invocation with no trial to run, which fails stale trials and queues them again, as a
        worker starting a trial does), then SIGCONT: the worker comes back to a trial that is no
        longer its own, unless it was between trials."""
        os.kill(worker, signal.SIGSTOP)
        try:
            time.sleep(float(ENV["ACCEL_GRACE_S"]) + self.rng.uniform(2, 6))
            other = self.tune("--n-trials", "0", log=f"node-{len(self.exits)}")
            other.wait(timeout=300)
            self._ended("another node, stale trials failed", other)
            time.sleep(self.rng.uniform(0, 4))
        finally:
            os.kill(worker, signal.SIGCONT)

    def _training(self, workers: list[int], wait_s: float = 60) -> list[int]:
        """The workers among `workers` that hold a RUNNING trial (waited for a while)."""
        deadline = time.time() + wait_s
        while time.time() < deadline:
            try:
                pids = {t.user_attrs.get("accel.pid") for t in self.trials()
                        if t.state.name == "RUNNING"}
            except Exception:  # the store restarting: ask again
                pids = set()
            if found := [w for w in workers if w in pids and w in self._workers()]:
                return found
            self.keep_running()
            time.sleep(0.2)
        return []

    def _workers(self) -> list[int]:
        import psutil

        if self.proc is None or self.proc.poll() is not None:
            return []
        children = psutil.Process(self.proc.pid).children(recursive=True)
        return [c.pid for c in children if "spawn_main" in " ".join(c.cmdline())]

    def _end(self, sig: int, how: str, wait_s: float = 120) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            how += " (then SIGKILL)"
        self._ended(how, self.proc)
        self.proc = None

    def calm(self, wait_s: float = 900) -> None:
        """The running invocation ends on its own; then one runs what is queued; `accel best`."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=wait_s)
                self._ended("ended", self.proc)
            except subprocess.TimeoutExpired:
                self._end(signal.SIGTERM, "SIGTERM after the faults")
            self.proc = None
        # Past the grace period every dead worker's trial is stale: an invocation with no trial
        # to run fails and queues them again; then one runs all that is queued.
        time.sleep(float(ENV["ACCEL_GRACE_S"]) + 2)
        proc = self.tune("--n-trials", "0")
        proc.wait(timeout=wait_s)
        self._ended("calm, stale trials closed", proc)
        waiting = sum(t.state.name == "WAITING" for t in self.trials())
        proc = self.tune("--n-trials", str(waiting), "--workers", "2")
        proc.wait(timeout=wait_s)
        self._ended(f"calm, {waiting} queued", proc)
        best = subprocess.run([sys.executable, "-m", "accel", "best", "--study", STUDY,
                               "--storage", self.storage, "--tracking-uri", self.server.url],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        self.exits.append(("accel best", best.returncode, best.stderr.strip()[-160:]))
        if "Traceback" in best.stderr:
            self.tracebacks.append("accel best")

    def trials(self) -> list:
        import optuna

        from accel.tune import open_storage

        return optuna.load_study(study_name=STUDY, storage=open_storage(self.storage)).trials

    def close(self) -> None:
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.server is not None:
            self.server.stop()
        self.pg.close()
