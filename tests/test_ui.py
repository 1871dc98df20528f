"""`accel ui`: MLflow 3's UI opens on its GenAI view unless the link says
`workflowType=machine_learning`; `accel ui` prints that link and opens the browser at it once the
server answers, where a browser can be shown (`--no-browser` to skip). The browser here is a
script named in $BROWSER that records the link it is given (Python's `webbrowser` runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from accel.tracking import Tracker
from tests.conftest import stop_group
from tests.test_scale_out import free_port

WAIT_S = 180  # a loaded 2-core machine starts MLflow's server slowly


def page(port: int, experiment_id: str) -> str:
    return (f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs"
            "?workflowType=machine_learning")


@pytest.fixture
def store(tmp_path) -> tuple[str, str]:
    """A store with one experiment besides MLflow's Default: (uri, its id)."""
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    return uri, Tracker(uri).experiment_id("digits")


def recording_browser(tmp_path: Path) -> tuple[Path, Path]:
    """(script for $BROWSER, the file where it writes each link it is asked to open)."""
    record, script = tmp_path / "opened.txt", tmp_path / "browser.sh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {record}\n')
    script.chmod(0o755)
    return script, record


def stop(proc: subprocess.Popen) -> None:
    stop_group(proc)


def test_accel_ui_opens_the_browser_at_the_model_training_view(tmp_path, store):
    uri, experiment_id = store
    script, record = recording_browser(tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(BROWSER=str(script), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log = tmp_path / "ui.err"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "accel", "ui", "--tracking-uri", uri,
                                 "--port", str(port)], cwd=tmp_path, env=env,
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.time() + WAIT_S
        while not record.exists() and time.time() < deadline:
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.5)
        assert record.read_text().split() == [page(port, experiment_id)], log.read_text()
        # It was opened once the server answered: the page is there to load.
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).close()
        assert f"open first: {page(port, experiment_id)}" in log.read_text()
    finally:
        stop(proc)


@pytest.mark.parametrize("flags,opened", [([], True), (["--no-browser"], False)])
def test_no_browser_skips_it_and_the_link_is_printed_either_way(store, monkeypatch, capsys,
                                                                flags, opened):
    from accel import console
    from accel.cli import main

    uri, experiment_id = store
    calls, servers = [], []
    monkeypatch.setattr(subprocess, "call",  # no server: the flag's effect
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
