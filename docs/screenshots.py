"""The pictures of docs/, taken from a real `accel ui` by headless Chromium, never drawn by hand.

It runs a small quickstart study in a scratch folder, registers its winner, starts `accel ui` on
that store (its own session; stopped with its whole process group at the end) and photographs:
the study's runs table with its nested trials, a trial's metric charts, the parent run's
optimisation-history plot, and the registered model.

    .venv/bin/python docs/screenshots.py [--out docs/img] [--chromium /usr/bin/chromium]

Needs Chromium (Debian: `apt-get install chromium`) and Playwright (`pip install -e '.[docs]'`,
which drives that Chromium: no browser download); about three minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY, MODEL = "quickstart-demo", "digits-quickstart"


def accel(*args: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "accel", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"accel {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(store: str, port: int, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "accel", "ui", "--tracking-uri", store,
                             "--port", str(port)], cwd=cwd, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit("accel ui ended before it served") from None
            time.sleep(1)
    raise SystemExit("accel ui did not answer within 120 s")


def shoot(page, url: str, out: Path, expand: str | None = None) -> None:
    """One PNG of `url` once the page is idle; `expand`: the run whose child rows to open."""
    page.goto(url)
    page.wait_for_timeout(6000)  # the UI polls its server: "network idle" never comes
    with contextlib.suppress(Exception):  # MLflow's assistant panel takes a third of the page
        page.get_by_role("button", name="Close").first.click(timeout=3000)
    if expand:
        row = page.get_by_role("row").filter(has_text=expand)
        row.get_by_role("button").first.click(timeout=20000)
    page.wait_for_timeout(4000)  # rows and charts draw after their data arrives
    page.screenshot(path=str(out))
    print(f"{out}  <- {url}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--work", help="keep the study here (made once, reused when present)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from mlflow.tracking import MlflowClient
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="accel-shots-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        store = f"sqlite:///{work / 'mlruns' / 'mlflow.db'}"
        where = ["--storage", str(work / "optuna.journal"), "--tracking-uri", store]
        if not (work / "optuna.journal").exists():
            accel("tune", str(ROOT / "experiments" / "quickstart.yaml"), "train.epochs=4",
                  "--study", STUDY, "--n-trials", "6", *where, cwd=work)
            accel("best", "--study", STUDY, "--register", MODEL, *where, cwd=work)

        client = MlflowClient(store)
        exp = client.get_experiment_by_name(STUDY)
        runs = client.search_runs([exp.experiment_id])
        parent = next(r for r in runs if r.data.tags.get("accel.role") == "study")
        trial = client.get_model_version_by_alias(MODEL, "champion").run_id

        port = free_port()
        ui = start_ui(store, port, work)
        try:
            server = f"http://127.0.0.1:{port}"
            base = f"{server}/#/experiments/{exp.experiment_id}"
            ml = "workflowType=machine_learning"
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.chromium,
                                            args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                shoot(page, f"{base}/runs?{ml}", out / "study-runs.png",
                      expand=f"study-{STUDY}")
                shoot(page, f"{base}/runs/{trial}/model-metrics?{ml}", out / "trial-curves.png")
                shoot(page, f"{server}/#/models/{MODEL}", out / "registered-model.png")
                browser.close()
            # The parent run's plot, the very file the UI shows under its artifacts.
            plot = client.download_artifacts(parent.info.run_id,
                                             "plots/optimization_history.png", str(work))
            shutil.copy(plot, out / "study-history.png")
        finally:
            os.killpg(ui.pid, signal.SIGTERM)
            try:
                ui.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(ui.pid, signal.SIGKILL)
                ui.wait()


if __name__ == "__main__":
    main()
