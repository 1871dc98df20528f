"""`accel verify --study S`: does the study's winner stay the winner? Its top trials (a
multi-objective study: its Pareto front) and its baseline rerun over the same fresh seeds, under
one verification run; the report (accel.verify.report) goes to the terminal and to MLflow."""

from __future__ import annotations

import numpy as np

from accel.config import ConfigError
from accel.console import note, quiet_libraries
from accel.reproduce import load_original
from accel.tracking import retry_locked, tracker_for
from accel.tune import study_record as record
from accel.tune.best import load_existing_study
from accel.tune.pareto import objective_names
from accel.tune.study import ATTR_TRACKING
from accel.uris import resolve_uri
from accel.verify import report as rp
from accel.verify.runs import (
    Candidate,
    Job,
    choose,
    close_running,
    finished_reruns,
    fresh_seeds,
    run_jobs,
    verification_run,
)


def check_args(args) -> None:
    if args.top < 1:
        raise ConfigError(f"--top {args.top}: must be >= 1 (the number of best trials to rerun)")
    if args.seeds < 2:
        raise ConfigError(f"--seeds {args.seeds}: must be >= 2 (an interval needs at least two "
                          "seeds; 5 is the default)")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be >= 1")


def study_objectives(study) -> list[tuple[str, str]]:
    return [(name, d.name.lower()) for name, d in zip(objective_names(study), study.directions,
                                                      strict=True)]


def cli_verify(args) -> int:
    check_args(args)
    quiet_libraries(study=True)
    study = load_existing_study(args.study, args.storage)
    objectives = study_objectives(study)
    uri = args.tracking_uri or study.user_attrs.get(ATTR_TRACKING) or resolve_uri(None)
    tracker = tracker_for(uri)
    candidates = _candidates(tracker, study, args.top)
    if not candidates:
        raise ConfigError(f"study '{args.study}' has no complete trial to verify")
    seeds = fresh_seeds(candidates, args.seeds)
    parent = study.user_attrs.get(record.ATTR_PARENT)
    run_id = verification_run(tracker, args.study, parent, {
        "top": args.top, "seeds": ",".join(map(str, seeds)),
        "objectives": ",".join(name for name, _ in objectives)})
    status = "FAILED"
    try:
        values = _rerun_missing(tracker, args, candidates, seeds, run_id, objectives, uri)
        report = (rp.single(args.study, objectives[0][0], candidates, seeds, values[:, 0, :],
                            objectives[0][1] == "maximize")
                  if len(objectives) == 1 else
                  rp.front(args.study, objectives, candidates, seeds, values))
        print(report.text)
        _log(tracker, run_id, parent, report, candidates, values, objectives)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        close_running(tracker, args.study, run_id)
        retry_locked(tracker.end_run, run_id, status)
    return 0


def _candidates(tracker, study, top: int) -> list[Candidate]:
    out = []
    for t in choose(study, top):
        run_id = (t.user_attrs.get(record.ATTR_RUN)
                  or record.find_trial_run(tracker, study.study_name, t.number))
        if run_id is None:
            raise ConfigError(f"trial {t.number} of study '{study.study_name}' has no MLflow "
                              "run in this store: pass the study's --tracking-uri")
        out.append(Candidate(t.number, run_id, list(t.values), bool(t.user_attrs.get(
            "accel.baseline")), load_original(tracker, run_id).config))
    return out


def _rerun_missing(tracker, args, candidates, seeds, run_id, objectives, uri) -> np.ndarray:
    """Train the (trial, seed) pairs not done yet; the values, [trial, objective, seed]."""
    names = [name for name, _ in objectives]
    done = finished_reruns(tracker, args.study, run_id, names)
    jobs = [Job(c, s, args.study, run_id, objectives, uri) for c in candidates for s in seeds
            if (c.number, s) not in done]
    note(f"verify {args.study}: {len(candidates)} trial(s) x {len(seeds)} seed(s) "
         f"({', '.join(map(str, seeds))}); {len(done)} rerun(s) done before, {len(jobs)} to run")
    run_jobs(jobs, args.workers)
    done = finished_reruns(tracker, args.study, run_id, names)
    return np.array([[[done[(c.number, s)].values[m] for s in seeds]
                      for m in range(len(names))] for c in candidates])


def _log(tracker, run_id: str, parent: str | None, report: rp.Report, candidates, values,
         objectives) -> None:
    """verify.csv, verify.md, verify.png and the verdict tags on the verification run; the
    verified best on the study's parent run."""
    names = [name for name, _ in objectives]
    retry_locked(tracker.log_text, run_id, report.csv, "verify.csv")
    retry_locked(tracker.log_text, run_id, f"{report.table_md}\n\n{report.verdict}\n",
                 "verify.md")
    retry_locked(tracker.log_figure, run_id, rp.figure(candidates, values, names), "verify.png")
    tags = {"accel.verified_best": report.best, "accel.p_best": f"{report.p_best:.3f}",
            "accel.verdict": report.verdict[:record.MAX_TAG_CHARS]}
    retry_locked(tracker.set_tags, run_id, tags)
    if parent:
        retry_locked(tracker.set_tags, parent, {**tags, "accel.verify_run": run_id})
