"""A password in a storage or tracking URL is never shown or kept: not on stdout or stderr, not in
MLflow params, tags or artifacts (config.yaml included), not in Optuna's study or trial attrs,
not in a child process's argv. PostgreSQL here uses trust auth, so a URL with any password
works: the test plants one, runs every command, and looks for it everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, TINY_OVERRIDES, run_in_process, stop_group
from tests.test_scale_out import free_port

PASSWORD = "pl4nted-s3cret"
TEXT = (".yaml", ".json", ".csv", ".md", ".txt", ".html")


def accel(cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ACCEL_"))}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-m", "accel", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def ui_argv(cwd: Path, uri: str) -> list[str]:
    """The command lines of every process `accel ui` starts, while it serves (its own is the
    user's: that one holds what the user typed)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "accel", "ui", "--tracking-uri", uri,
                             "--port", str(port)], cwd=cwd, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None, "accel ui ended"
                time.sleep(1)
        import psutil

        argv = []  # its descendants: the server runs in a session (process group) of its own
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                argv.append(" ".join(child.cmdline()))
            except psutil.Error:
                continue
        return argv
    finally:
        stop_group(proc, wait_s=20)


def everything_mlflow_holds(uri: str, tmp: Path) -> list[str]:
    from accel.tracking import Tracker

    client = Tracker(uri).client
    kept = []
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], max_results=1000):
            kept += [*run.data.params.values(), *run.data.tags.values()]
            run_id = run.info.run_id
            folder = Path(client.download_artifacts(run_id, "", str(tmp / run_id)))
            kept += [p.read_text(errors="replace") for p in folder.rglob("*")
                     if p.suffix in TEXT]
    return kept


def everything_optuna_holds(storage: str) -> list[str]:
    import optuna

    from accel.tune import open_storage

    kept = []
    store = open_storage(storage)
    for summary in optuna.get_all_study_summaries(store):
        study = optuna.load_study(study_name=summary.study_name, storage=store)
        kept += [repr(study.user_attrs), repr(store.get_study_system_attrs(study._study_id))]
        kept += [repr((t.user_attrs, t.system_attrs)) for t in study.trials]
    return kept


# make test covers it: every path at once; the store's and the server's passwords also in
# test_search and test_scale_out
@pytest.mark.slow
def test_a_planted_password_is_never_shown_or_kept(tmp_path, postgres_databases):
    uri = f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/{postgres_databases()}"
    # The storage's password as a query parameter, as libpq also takes it.
    storage = f"postgresql://postgres@127.0.0.1:5432/{postgres_databases()}?password={PASSWORD}"
    exp = tmp_path / "pw.yaml"
    exp.write_text(yaml.safe_dump({"name": "pw", "search": {"pruner": "none", "space": {
        "train.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}}}}))
    tiny = [*TINY_OVERRIDES, "train.epochs=1", "tracking.log_checkpoint=false"]
    shown = []

    def ok(*args: str) -> subprocess.CompletedProcess:
        proc = accel(tmp_path, *args)
        shown.extend([proc.stdout, proc.stderr])
        assert proc.returncode == 0, f"accel {args[0]}: {proc.stderr[-2000:]}"
        return proc

    ok("train", str(exp), *tiny, "--tracking-uri", uri)
    ok("tune", str(exp), *tiny, "--study", "pw", "--n-trials", "2", "--storage", storage,
       "--tracking-uri", uri)
    best = ok("best", "--study", "pw", "--storage", storage, "--tracking-uri", uri)
    run_id = next(line.split()[2] for line in best.stdout.splitlines()
                  if line.startswith("mlflow run:"))
    ok("reproduce", run_id, "--tracking-uri", uri)
    ok("verify", "--study", "pw", "--top", "1", "--seeds", "2", "--storage", storage,
       "--tracking-uri", uri)
    ok("ablate", str(exp), *tiny, "--techniques", "ga", "--repeats", "1", "--tracking-uri", uri)
    assert "postgres:***@127.0.0.1" in "".join(shown)  # it is named, redacted
    assert "?password=***" in "".join(shown)

    places = {
        "stdout/stderr": shown,
        "MLflow params, tags, artifacts": everything_mlflow_holds(uri, tmp_path / "art"),
        "Optuna attrs": everything_optuna_holds(storage),
        "argv of the processes accel ui starts": ui_argv(tmp_path, uri),
    }
    assert places["argv of the processes accel ui starts"], "accel ui started no process"
    assert len(places["MLflow params, tags, artifacts"]) > 100  # the search really read them
    for place, texts in places.items():
        assert not [t for t in texts if PASSWORD in t], f"the password leaked into {place}"


# Each way a URL carries a password, and what is shown in its place.
UNREACHABLE = {
    "server, user:password@": ("--tracking-uri", f"http://someone:{PASSWORD}@127.0.0.1:1",
                               "someone:***@127.0.0.1"),
    "server, :password@": ("--tracking-uri", f"http://:{PASSWORD}@127.0.0.1:1", "//:***@127.0.0.1"),
    "storage, user:password@": ("--storage", f"postgresql://someone:{PASSWORD}@127.0.0.1:1/nowhere",
                                "someone:***@127.0.0.1"),
    "storage, :password@": ("--storage", f"postgresql://:{PASSWORD}@127.0.0.1:1/nowhere",
                            "//:***@127.0.0.1"),
    "storage, ?password=": ("--storage",
                            f"postgresql://someone@127.0.0.1:1/nowhere?password={PASSWORD}",
                            "nowhere?password=***"),
    "storage, &password=": ("--storage", f"postgresql://someone@127.0.0.1:1/nowhere?"
                            f"sslmode=disable&password={PASSWORD}&connect_timeout=5",
                            "&password=***&connect_timeout=5"),
}


@pytest.mark.parametrize("case", sorted(UNREACHABLE))
def test_an_unreachable_store_fails_fast_with_one_redacted_line(case):
    """The command in this process: exit 2, one line, the password hidden in each URL form."""
    flag, url, shown = UNREACHABLE[case]
    started = time.time()
    proc = run_in_process("tune", "--study", "down", flag, url)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert time.time() - started < 30  # the probe waits <= 10 s
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and shown in lines[0], proc.stderr[-2000:]
    assert PASSWORD not in proc.stderr + proc.stdout


REAL_PROCESS = "storage, &password="  # the storage's driver (SQLAlchemy, psycopg2) in the way


# make test covers it: each URL form in-process:
# test_an_unreachable_store_fails_fast_with_one_redacted_line[<case>]; a real process's whole
# stderr: this test's [storage, &password=]
@pytest.mark.parametrize("case", [pytest.param(case, marks=() if case == REAL_PROCESS
                                               else pytest.mark.slow)
                                  for case in sorted(UNREACHABLE)])
def test_an_unreachable_store_fails_a_real_accel_fast_with_one_redacted_line(case):
    """A real `accel` process: whatever reaches its stderr (a library's warning or log line
    included) is the one line, and the interpreter's start-up is inside the 30 s."""
    flag, url, shown = UNREACHABLE[case]
    started = time.time()
    proc = accel(ROOT, "tune", "--study", "down", flag, url, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert time.time() - started < 30  # interpreter start-up included; the probe waits <= 10 s
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and shown in lines[0], proc.stderr[-2000:]
    assert PASSWORD not in proc.stderr + proc.stdout
