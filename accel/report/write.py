"""Writing a page: a study's, a run's or an ablation's, into a local folder (report.html, its
Markdown twin report.md, and the config that reruns the answer), then logged on the run it
describes as `report/`."""

from __future__ import annotations

from pathlib import Path

from accel.console import progress, warn
from accel.errors import ConfigError, one_line
from accel.report import page as pg
from accel.report import runs, study, trials
from accel.tracking import retry_locked
from accel.uris import redact, sqlite_path

REPORTS = "reports"  # beside a SQLite store's database, or in ./mlruns/ for other stores
ARTIFACT_DIR = "report"


def default_folder(uri: str, name: str) -> Path:
    """Where a page is written: `reports/NAME/` beside a SQLite store's database (the default
    store: mlruns/reports/NAME/), else mlruns/reports/NAME/ here."""
    db = sqlite_path(uri)
    return (db.parent if db is not None else Path("mlruns")) / REPORTS / name


def _folder(out: str | Path | None, uri: str, name: str) -> Path:
    folder = Path(out) if out else default_folder(uri, name)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--out {folder}: a file, not a folder; give a folder for the page")
    return folder


def _publish(page: pg.Page, tracker, run_id: str | None, folder: Path) -> Path:
    """Write the page and its files; log them on `run_id` under report/."""
    html = pg.write(page, folder)
    if run_id:
        for name in ("report.html", "report.md", *page.files):
            retry_locked(tracker.log_artifact, run_id, folder / name, ARTIFACT_DIR)
    return html


def study_page(optuna_study, tracker, uri: str, storage: str) -> tuple[pg.Page, str | None]:
    """The study's page and its parent run."""
    facts = study.gather(optuna_study, tracker, uri, storage)
    answer, files = study.answer(facts)
    sections = [study.question(facts), answer, study.how_sure(facts), *trials.sections(facts)]
    states = [t.state.name for t in optuna_study.trials]
    subtitle = (f"{len(states)} trials: {states.count('COMPLETE')} complete, "
                f"{states.count('PRUNED')} pruned, {states.count('FAIL')} failed")
    source = f"Optuna {redact(storage)} and MLflow {redact(uri)}"
    page = pg.Page(f"Study {optuna_study.study_name}", subtitle, sections, source, files)
    return page, facts.parent.info.run_id if facts.parent else None


def write_study_report(optuna_study, tracker, uri: str, storage: str,
                       out: str | Path | None = None) -> Path:
    """The study's page, written and logged on its parent run; returns report.html's path."""
    folder = _folder(out, uri, optuna_study.study_name)
    page, parent = study_page(optuna_study, tracker, uri, storage)
    return _publish(page, tracker, parent, folder)


def write_run_report(tracker, uri: str, run, out: str | Path | None = None) -> Path:
    """One run's page, or an ablation's (its parent run), written and logged on that run."""
    folder = _folder(out, uri, run.info.run_id)
    role = run.data.tags.get("accel.role")
    page = (runs.ablation_page if role == "ablation" else runs.run_page)(tracker, uri, run)
    return _publish(page, tracker, run.info.run_id, folder)


def after_study(optuna_study, tracker, storage: str) -> None:
    """At the end of `accel tune`: the study's page, and where it is; a page that cannot be
    written is a warning, never the study's failure."""
    try:
        html = write_study_report(optuna_study, tracker, tracker.uri, storage)
        progress(f"report: {html}")
    except Exception as e:
        warn(f"could not write the study's report: {one_line(e)}")


def after_ablation(tracker, run_id: str | None) -> None:
    """At the end of `accel ablate`: the ablation's page, and where it is."""
    if run_id is None:
        return
    try:
        run = retry_locked(tracker.client.get_run, run_id)
        print(f"report: {write_run_report(tracker, tracker.uri, run)}")
    except Exception as e:
        warn(f"could not write the ablation's report: {one_line(e)}")
