"""`accel ui`: MLflow 3's UI opens on its GenAI view unless the link says
`workflowType=machine_learning`; `accel ui` prints that link and opens the browser at it once the
server answers, where a browser can be shown (`--no-browser` to skip). The browser here is a
script named in $BROWSER that records the link it is given (Python's `webbrowser` runs it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from accel.tracking import Tracker
from tests.test_scale_out import free_port

WAIT_S = 180  # a loaded 2-core machine starts MLflow's server slowly


def page(port: int, experiment_id: str) -> str:
    return (f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs"
            "?workflowType=machine_learning")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[str, str]:
    """A store with one experiment besides MLflow's Default: (uri, its id); made once, every
    test here only reads it."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'mlruns' / 'mlflow.db'}"
    return uri, Tracker(uri).experiment_id("digits")


def recording_browser(tmp_path: Path) -> tuple[Path, Path]:
    """(script for $BROWSER, the file where it writes each link it is asked to open)."""
    record, script = tmp_path / "opened.txt", tmp_path / "browser.sh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {record}\n')
    script.chmod(0o755)
    return script, record


@pytest.mark.parametrize("flags,opened", [([], True), (["--no-browser"], False)])
def test_no_browser_skips_it_and_the_link_is_printed_either_way(store, monkeypatch, capsys,
                                                                flags, opened):
    from accel import console, foreground
    from accel.cli import main

    uri, experiment_id = store
    calls, servers = [], []
    monkeypatch.setattr(foreground, "run_group",  # no server: the flag's effect
                        lambda cmd, env: servers.append(cmd) or 0)
    monkeypatch.setattr(console, "open_when_serving", lambda *a: calls.append(a))
    assert main(["ui", "--tracking-uri", uri, "--port", "5123", *flags]) == 0
    link = page(5123, experiment_id)
    assert calls == ([("http://127.0.0.1:5123", link)] if opened else [])
    [cmd] = servers  # bound to 127.0.0.1, one worker process (MLflow's default is 4)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--workers") + 1] == "1"
    assert f"open first: {link}" in capsys.readouterr().err


def test_a_browser_is_opened_only_where_one_can_be_shown(monkeypatch):
    """As `jupyter lab`: a graphical session or a browser named in $BROWSER; over SSH without
    either, a text browser must not take over the terminal the server runs in."""
    from accel.console import browser_available

    monkeypatch.setattr(sys, "platform", "linux")
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"):
        monkeypatch.delenv(name, raising=False)
    assert not browser_available()
    monkeypatch.setenv("DISPLAY", ":0")
    assert browser_available()
    monkeypatch.delenv("DISPLAY")
    monkeypatch.setenv("BROWSER", "firefox")
    assert browser_available()


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid` (children, their children, ...): {pid: command line}."""
    parent, cmdline = {}, {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
                cmdline[int(entry.name)] = Path(f"/proc/{entry.name}/cmdline").read_text()
            except OSError:  # ended meanwhile
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[2])
    found, frontier = {}, [pid]
    while frontier:
        here = frontier.pop()
        for child, ppid in parent.items():
            if ppid == here and child not in found:
                found[child] = cmdline[child].replace("\0", " ")
                frontier.append(child)
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie (an ended process its new parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


# make test covers it: SIGTERM and Ctrl-C stop accel ui as SIGHUP does (a KeyboardInterrupt,
# then the server's whole group stopped: accel.foreground), a signal's name in the last line as
# SIGHUP's: test_accel_ui_opens_the_browser_at_the_model_training_view[SIGHUP]; "stopped by
# Ctrl-C": tests/test_registry.py::test_stopping_a_registration_leaves_the_trials_run_finished
SLOW_STOPS = (signal.SIGTERM, signal.SIGINT)


@pytest.mark.parametrize("sig", [pytest.param(s, marks=pytest.mark.slow if s in SLOW_STOPS else ())
                                 for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)],
                         ids=lambda s: s.name)
def test_accel_ui_opens_the_browser_at_the_model_training_view(tmp_path, store, sig):
    """And any stop of accel ui stops its whole server: one `accel ui` per stop. It opens the
    browser (no display: the one in $BROWSER) at the model-training view once the server
    answers, and prints that link. Then `kill -TERM`, Ctrl-C or the terminal closing (SIGHUP),
    sent to the `accel ui` process alone: it exits with 128 + the signal, the port is free and
    none of the processes it started is left. MLflow's job runner (huey consumers) is not
    started at all."""
    uri, experiment_id = store
    script, record = recording_browser(tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION")}
    env.update(BROWSER=str(script))
    log = tmp_path / "ui.err"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "accel", "ui", "--tracking-uri", uri,
                                 "--port", str(port)], cwd=tmp_path, env=env,
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
    started: dict[int, str] = {}
    try:
        deadline = time.time() + WAIT_S
        while not record.exists() and time.time() < deadline:
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.5)
        assert record.read_text().split() == [page(port, experiment_id)], log.read_text()
        # It was opened once the server answered: the page is there to load.
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).close()
        assert f"open first: {page(port, experiment_id)}" in log.read_text()
        started = descendants(proc.pid)
        assert started, "accel ui started no server process"
        jobs = [c for c in started.values() if "huey" in c or "mlflow.server.jobs" in c]
        assert not jobs, f"MLflow's job runner was started: {jobs}"
        os.kill(proc.pid, sig)  # to accel alone, as `kill` does; not to its process group
        assert proc.wait(timeout=60) == 128 + sig, log.read_text()[-2000:]
        deadline = time.time() + 30
        while (listening(port) or any(map(running, started))) and time.time() < deadline:
            time.sleep(0.5)
        assert not listening(port), f"port {port} still answers after {sig.name}"
        left = {pid: cmd for pid, cmd in started.items() if running(pid)}
        assert not left, f"left running after {sig.name}: {left}"
        assert log.read_text().rstrip().endswith(
            f"accel: stopped by {'Ctrl-C' if sig == signal.SIGINT else sig.name}")
    finally:
        for pid in [proc.pid, *started]:  # whatever a failure left behind
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
