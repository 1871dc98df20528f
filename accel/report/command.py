"""`accel report --study S` or `accel report RUN_ID`: the page of a study, a run or an
ablation, written locally and logged on its run. Light at import: `accel --help` builds this
command's arguments."""

from __future__ import annotations

from accel.console import quiet_libraries
from accel.errors import ConfigError
from accel.uris import resolve_uri

HELP = ("write the page of a study, a run or an ablation: one HTML file that needs no network "
        "and its Markdown twin, logged on the run as report/")


def arguments(p) -> None:
    p.add_argument("run_id", nargs="?", metavar="RUN_ID", help="a run (an ablation's parent run "
                   "gives the ablation's page; a study's parent run, the study's)")
    p.add_argument("--study", metavar="NAME", help="the study's page")
    p.add_argument("--out", metavar="DIR", help="the page's folder (default: reports/NAME beside "
                   "a SQLite store's database, else mlruns/reports/NAME)")


def check_args(args) -> None:
    if bool(args.study) == bool(args.run_id):
        given = "both" if args.study else "neither"
        raise ConfigError(f"accel report takes --study NAME or a RUN_ID, not {given}: a "
                          "study's page, or one run's (an ablation's parent run gives the "
                          "ablation's page)")


def cli_report(args) -> int:
    from accel.report.write import write_run_report, write_study_report
    from accel.tracking.store import fetch_run, open_store
    from accel.tune.best import load_existing_study
    from accel.tune.storage import default_storage
    from accel.tune.study import ATTR_TRACKING

    check_args(args)
    quiet_libraries(study=True)
    if args.run_id:
        tracker = open_store(args.tracking_uri)
        run = fetch_run(tracker, args.run_id)
        if run.data.tags.get("accel.role") != "study":
            return _said(write_run_report(tracker, tracker.uri, run, args.out), run.info.run_id)
        args.study = run.data.tags.get("accel.study", "")  # a study's parent run: its study
    study = load_existing_study(args.study, args.storage)
    uri = args.tracking_uri or study.user_attrs.get(ATTR_TRACKING) or resolve_uri(None)
    tracker = open_store(uri)
    html = write_study_report(study, tracker, uri, args.storage or default_storage(), args.out)
    return _said(html, study.user_attrs.get("accel.parent_run_id"))


def _said(html, run_id: str | None) -> int:
    print(f"report: {html}")
    print(f"markdown: {html.with_suffix('.md')}")
    if run_id:
        print(f"logged on run {run_id} as report/")
    return 0
