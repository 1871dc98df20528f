"""`accel report`: a real small study's page (the quickstart on two objectives, with a trial
whose worker died, failed and retried), checked against Optuna's and MLflow's records; the page
in a real browser; a 50-trial study's page against the time and size limits."""

from __future__ import annotations

import html as html_text
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from tests import chromium
from tests.conftest import ROOT, cli_main, new_store, run_in_process

SECTIONS = ("question", "answer", "sure", "importances", "parallel", "pareto", "curves",
            "target", "states", "time")
TWO_OBJECTIVES = [{"metric": "val_accuracy", "direction": "maximize"},
                  {"metric": "train_time_s", "direction": "minimize"}]


class Cells(HTMLParser):
    """The rows of every table in an HTML fragment, as lists of cell texts."""

    def __init__(self, html: str):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def section(html: str, key: str) -> str:
    match = re.search(rf'<section id="{key}">(.*?)</section>', html, re.S)
    assert match, f"no section {key}"
    return match.group(1)


def commands(fragment: str) -> list[str]:
    return [html_text.unescape(c) for c in re.findall(r'<pre class="command"><code>(.*?)</code>',
                                               fragment, re.S)]


def experiment(folder: Path) -> Path:
    """The quickstart on two objectives, 3 epochs of 8 updates, fp32, no system metrics."""
    data = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    data["name"] = "qs-report"
    data["train"].update(epochs=3, epoch_length=8, amp="off")
    data["data"]["num_workers"] = 0
    data["tracking"] = {"system_metrics": False}
    data["search"].update(objectives=TWO_OBJECTIVES, pruner="none")
    path = folder / "qs-report.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def leave_a_dead_workers_trial(exp: Path, journal: Path, store: str):
    """The study's first trial taken by a worker that then died: RUNNING, its process gone.
    The next `accel tune` fails it and queues it again, as it does after a killed worker."""
    import socket

    from accel import config
    from accel.tune.space import trial_config
    from accel.tune.study import prepare

    study, job = prepare(config.load(exp), "qs-report", str(journal), store)
    trial = study.ask()
    trial_config(job.cfg, job.dims, trial)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process that no longer runs
    trial.set_user_attr("accel.host", socket.gethostname())
    trial.set_user_attr("accel.pid", gone.pid)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A real study: trial 0's worker died (failed, retried as trial 1), four trials ran."""
    tmp = tmp_path_factory.mktemp("report")
    exp, journal, store = experiment(tmp), tmp / "optuna.journal", new_store(tmp)
    leave_a_dead_workers_trial(exp, journal, store)
    where = ("--storage", str(journal), "--tracking-uri", store)
    code, _, err = cli_main("tune", str(exp), "--study", "qs-report", "--n-trials", "4", *where)
    assert code == 0, err[-3000:]
    said = re.search(r"^report: (.+report\.html)$", err, re.M)
    assert said, f"accel tune did not say where the report is:\n{err[-2000:]}"
    return {"tmp": tmp, "exp": exp, "journal": journal, "store": store, "where": where,
            "tune_report": Path(said.group(1))}


def load(made):
    import optuna

    from accel.tune.storage import open_storage

    return optuna.load_study(study_name="qs-report", storage=open_storage(str(made["journal"])))


def client(made):
    from mlflow.tracking import MlflowClient

    return MlflowClient(made["store"])


def report(made, *args: str) -> tuple[str, Path]:
    code, out, err = cli_main("report", *args, *made["where"])
    assert code == 0, err[-3000:]
    path = Path(re.search(r"^report: (.+)$", out, re.M).group(1))
    return path.read_text(), path


def test_tune_writes_the_page_beside_the_store_and_logs_it(made):
    page = made["tune_report"]
    assert page == made["tmp"] / "mlruns" / "reports" / "qs-report" / "report.html"
    assert page.is_file() and page.with_suffix(".md").is_file()
    study = load(made)
    parent = study.user_attrs["accel.parent_run_id"]
    logged = {f.path for f in client(made).list_artifacts(parent, "report")}
    assert {"report/report.html", "report/report.md"} <= logged, logged


def test_the_page_holds_every_section_and_the_records_answer(made):
    html, path = report(made, "--study", "qs-report")
    for key in SECTIONS:
        section(html, key)
    assert html.index('id="question"') < html.index('id="answer"') < html.index('id="sure"')
    study = load(made)
    # Every complete trial is a row of the parallel coordinates' table (the failed one is not).
    rows = Cells(section(html, "parallel")).tables[0]
    assert sorted(int(row[0]) for row in rows[1:]) == [
        t.number for t in study.trials if t.state.name == "COMPLETE"] == [1, 2, 3, 4]
    # The answer is what `accel best --pick val_accuracy` names, with its params and command.
    code, out, err = cli_main("best", "--study", "qs-report", "--pick", "val_accuracy",
                              *made["where"])
    assert code == 0, err
    number = int(re.search(r"^best trial: (\d+)$", out, re.M).group(1))
    run_id = re.search(r"^mlflow run: (\w+)", out, re.M).group(1)
    best_command = re.search(r"^reproduce: \S+ (reproduce .+)$", out, re.M).group(1)
    trial = study.trials[number]
    assert trial.user_attrs["mlflow_run_id"] == run_id
    answer = section(html, "answer")
    assert f"<dt>best trial</dt><dd>{number}</dd>" in answer
    assert f"<dt>MLflow run</dt><dd>{run_id}</dd>" in answer
    assert f"accel {best_command}" in commands(answer)
    params = {row[0]: row[1:] for row in Cells(answer).tables[0][1:]}
    logged = client(made).get_run(run_id).data.params
    assert set(params) == set(trial.params)
    for key, value in trial.params.items():
        assert params[key] == ["null" if value is None else str(value), logged[key]], key
    # The config that `accel train trial-NNN.yaml` reruns is the run's own config.yaml.
    rerun = path.parent / f"trial-{number:03d}.yaml"
    assert f"accel train {rerun.name} --tracking-uri {made['store']}" in commands(answer)
    assert rerun.read_text() == Path(client(made).download_artifacts(
        run_id, "config.yaml", str(made["tmp"]))).read_text()
    assert f"trial-{number:03d}.yaml" in {Path(f.path).name for f in client(made).list_artifacts(
        study.user_attrs["accel.parent_run_id"], "report")}


def test_the_page_says_what_became_of_the_failed_trial(made):
    html, _ = report(made, "--study", "qs-report")
    study = load(made)
    assert [t.state.name for t in study.trials][:2] == ["FAIL", "COMPLETE"]
    assert study.trials[1].system_attrs["failed_trial"] == 0
    tables = {t[0][0]: t[1:] for t in Cells(section(html, "states")).tables}
    counts = dict(tables["state"])
    assert counts["failed"] == "1" and counts["retried"] == "1" and counts["complete"] == "4"
    failed = tables["trial"][0]
    assert failed[0] == "0" and "worker process is gone" in failed[1]
    assert failed[2] == "retried as trial 1 (complete)"


def test_the_markdown_twin_says_the_same(made):
    _, path = report(made, "--study", "qs-report")
    md = path.with_suffix(".md").read_text()
    for title in ("## The question", "## The answer", "## How sure", "## Pareto front",
                  "## Where the time went"):
        assert title in md
    html = path.read_text()
    for command in commands(section(html, "answer")):
        assert f"\n{command}\n" in md


def test_how_sure_shows_the_verify_table_once_verify_ran(made):
    html, _ = report(made, "--study", "qs-report")
    sure = section(html, "sure")
    assert "Not verified yet" in sure
    assert any(c.startswith("accel verify --study qs-report") for c in commands(sure))
    code, _, err = cli_main("verify", "--study", "qs-report", "--top", "1", "--seeds", "2",
                            *made["where"])
    assert code == 0, err[-3000:]
    html, _ = report(made, "--study", "qs-report")
    sure = section(html, "sure")
    table = Cells(sure).tables[0]
    assert table[0][-1] == "p(non-dominated)" and len(table) >= 2
    verification = client(made).search_runs(
        [client(made).get_experiment_by_name("qs-report").experiment_id],
        "tags.`accel.role` = 'verify'")[0]
    assert verification.data.tags["accel.verdict"] in html_text.unescape(sure)


def test_a_runs_page_and_bad_input(made):
    study = load(made)
    run_id = study.trials[2].user_attrs["mlflow_run_id"]
    html, path = report(made, run_id)
    assert path.parent.name == run_id
    for key in ("question", "answer", "sure", "curves", "time"):
        section(html, key)
    assert f"accel reproduce {run_id} --tracking-uri {made['store']}" in commands(html)
    for args, words in ((("--study", "nope"), "no study 'nope'"),
                        (("deadbeef" * 4,), "no run 'deadbeef"),
                        ((), "not neither"),
                        (("--study", "qs-report", run_id), "not both")):
        code, _, err = cli_main("report", *args, *made["where"])
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and words in lines[0], err


def test_the_page_renders_offline_in_chromium(made):
    import io

    from PIL import Image

    binary = chromium.find()
    if binary is None:
        pytest.skip("no Chromium installed (Debian: apt-get install chromium; .ci/run installs "
                    "it where it can)")
    page = made["tune_report"]
    seen = chromium.visit(page, binary=binary)
    assert len(seen.figures) >= 7, seen.figures
    assert all(f["drawn"] and f["traces"] > 0 for f in seen.figures), seen.figures
    assert not seen.errors, seen.errors
    assert not seen.requests, f"the page asked the network for {seen.requests}"
    shot = Image.open(io.BytesIO(seen.png)).convert("RGB")
    assert shot.height > 2000 and len(shot.getcolors(1 << 24) or []) > 200, "a blank page"
    assert seen.pdf.startswith(b"%PDF") and len(seen.pdf) > 20_000
    narrow = chromium.visit(page, width=400, height=800, binary=binary)
    assert narrow.overflow_px <= 0, f"{narrow.overflow_px} px wider than a 400 px window"
    assert all(f["drawn"] for f in narrow.figures) and not narrow.errors


# --- a 50-trial study: time and size -----------------------------------------------------------


def fake_study(folder: Path, n: int) -> tuple[str, str]:
    """A study of `n` trials asked of Optuna and recorded in MLflow as `accel tune` records them
    (parent run, one child run per trial with its config, per-epoch metrics and final state),
    with a made-up objective instead of training: (journal, store)."""
    import math

    from accel import config
    from accel.tracking import Tracker
    from accel.tune import study_record as record
    from accel.tune.space import trial_config
    from accel.tune.study import prepare

    exp = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    path, journal, store = folder / "q50.yaml", folder / "optuna.journal", new_store(folder)
    path.write_text(yaml.safe_dump({**exp, "name": "q50"}))
    study, job = prepare(config.load(path), "q50", str(journal), store)
    tracker = Tracker(store)
    for _ in range(n):
        trial = study.ask()
        cfg = trial_config(job.cfg, job.dims, trial)
        run_id = tracker.start_run("q50", record.trial_run_name(trial.number),
                                   tags=record.trial_tags("q50", trial.number, job.invocation),
                                   parent_run_id=job.parent_run_id)
        tracker.log_config(run_id, cfg)
        trial.set_user_attr(record.ATTR_RUN, run_id)
        lr = math.log10(cfg.train.lr)
        for epoch in range(1, cfg.train.epochs + 1):
            accuracy = 0.99 - 0.1 * (lr + 2.5) ** 2 - 0.4 / epoch
            tracker.log_metrics(run_id, {"val_accuracy": accuracy, "val_loss": 1 - accuracy,
                                         "train_loss": 1.1 - accuracy, "epoch_time_s": 0.3,
                                         "train_throughput": 4000.0}, step=epoch)
        tracker.log_metrics(run_id, {"train_time_s": 0.3 * cfg.train.epochs}, step=epoch)
        study.tell(trial, accuracy)
        record.close_trial_run(tracker, "q50", trial.number, "COMPLETE", run_id=run_id)
    record.update_parent(tracker, study, job.parent_run_id, plots=False)
    tracker.end_run(job.parent_run_id, "FINISHED")
    return str(journal), store


# make test covers it: every complete trial in the page's table, at 4 trials:
# test_the_page_holds_every_section_and_the_records_answer
@pytest.mark.slow
def test_a_50_trial_study_report_holds_every_trial_within_10_mb(tmp_path):
    """Its time is a benchmark's (bench/report_time.py), not an assertion here."""
    journal, store = fake_study(tmp_path, 50)
    proc = run_in_process("report", "--study", "q50", "--storage", journal, "--tracking-uri", store)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = Path(re.search(r"^report: (.+)$", proc.stdout, re.M).group(1))
    size = page.stat().st_size + page.with_suffix(".md").stat().st_size
    assert size < 10e6, f"{size / 1e6:.1f} MB"
    rows = Cells(section(page.read_text(), "parallel")).tables[0]
    assert len(rows) == 1 + 50  # every trial in the figure's table
