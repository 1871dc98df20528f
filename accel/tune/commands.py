"""The `accel tune` command: set the study up, run this node's trials, close what is left. It
makes its one MLflow `Tracker` during set-up and hands it to every helper that uses the store."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from accel import signals
from accel.config import Config, ConfigError
from accel.console import note, program, progress, quiet_libraries, warn
from accel.errors import one_line
from accel.tracking import Tracker, retry_locked, tracker_for
from accel.tune import chance, pareto, warm
from accel.tune import study_record as record
from accel.tune.best import close_what_was_left, storage_flag
from accel.tune.nodes import NodeLease, end_lease, live_nodes
from accel.tune.space import check_search
from accel.tune.storage import default_storage, is_journal, open_storage
from accel.tune.study import TuneJob, prepare
from accel.tune.workers import clean_up, fail_stale, run_workers
from accel.uris import redact, resolve_uri

if TYPE_CHECKING:  # Optuna's types only: importing optuna here would slow every command
    import argparse

    from optuna import Study

WarmStart = tuple[list, list, str | None]  # (queued run values, copied trials, other study)
StudyPage = Callable[["Study", Tracker, str], None]  # (study, tracker, storage): writes the page


def cli_tune(args: argparse.Namespace, cfg: Config, page: StudyPage | None = None) -> int:
    """`accel tune`: prepare the study and its parent run, run this node's trials, close what
    is left; the parent run is finished by the last node to end. A stop prints the command that
    carries the study on: `args.command_line` (set by `accel.cli.main`) with its --n-trials.
    `page` writes the study's page unless stopped (the CLI passes accel.report's, which sits
    above this package)."""
    n_trials = args.n_trials if args.n_trials is not None else cfg.search.n_trials
    if n_trials < 0:
        raise ConfigError(f"--n-trials {n_trials}: must be >= 0 (0: create the study only)")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be >= 1")
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError(f"--timeout {args.timeout}: must be > 0 seconds")
    quiet_libraries(study=True)
    warm_start = _check_warm_start(cfg, args)  # refuses bad run ids and studies before set-up
    status, code = "FAILED", 1
    study, job, tracker = _set_up(cfg, args, warm_start)
    try:  # from the end of set-up on, a stop ends this node's trials and the parent run KILLED
        code = _run_node(study, job, tracker, n_trials)
        status = "FINISHED" if code == 0 else "FAILED"
    except KeyboardInterrupt:
        status, code = "KILLED", signals.exit_code()
    finally:
        signals.ignore_stops()  # a second stop must not cut the clean-up short
        try:
            _finish_parent(tracker, study, job, status)
        except Exception as e:  # the store is away: the next `accel tune` or `accel best` ends it
            warn(f"could not end the study's parent run {job.parent_run_id}: {one_line(e)}")
    if page is not None and status != "KILLED":  # the study's page, and where it is
        page(study, tracker, job.storage)
    progress(_study_summary(study, job, tracker))
    if status == "KILLED":
        again = _command_for_trials_left(study, job, tracker, n_trials,
                                         getattr(args, "command_line", None))
        note(f"interrupted; this run's unfinished trial(s) were marked FAIL and queued again, to "
             f"carry on from their checkpoints (their MLflow runs KILLED; the study's parent run "
             f"{job.parent_run_id}); carry the study on with: "
             f"{again}")
    elif code != 0:
        note(f"exit {code}: a worker process ended with an error (its last lines are above)")
    elif n_trials and _failed_only(study, job.invocation):
        code = 1  # no trial of this invocation completed, and not because of pruning
        note("exit 1: no trial of this invocation completed and some failed; each failed "
             "trial's run holds its error (tag accel.error)")
    return code


def _command_for_trials_left(study: Study, job: TuneJob, tracker: Tracker, n_trials: int,
                             command_line: list[str] | None) -> str:
    """The command that runs the trials this invocation had left (the stopped trial among
    them): `command_line` (as typed, passwords hidden) with its --n-trials replaced, and what
    became of the study's parent run."""
    mine = [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(record.ATTR_INVOCATION) == job.invocation]
    # A trial counts as done when complete, pruned, or failed by its own error (a stopped
    # trial carries none).
    done = sum(t.state.name in ("COMPLETE", "PRUNED")
               or (t.state.name == "FAIL" and record.ATTR_ERROR in t.user_attrs
                   and not t.user_attrs.get(record.ATTR_STOPPED)) for t in mine)
    left = max(n_trials - done, 0)
    argv = command_line or [program(), "tune", "--study", job.study]
    command = shlex.join(_with_n_trials(argv, left))
    try:
        parent = tracker.client.get_run(job.parent_run_id).info.status
        became = (f"the study's parent run {job.parent_run_id} is {parent}; that command "
                  "marks it RUNNING again and adds its trials to it")
    except Exception:  # the store is away: the lines above already said the run's state
        became = f"the study's parent run is {job.parent_run_id}"
    return f"{command} ({left} of this run's {n_trials} trial(s) left; {became})"


def _with_n_trials(argv: list[str], n: int) -> list[str]:
    """`argv` with `--n-trials n` in place of any --n-trials it had (also `--n-trials=K` and
    the abbreviations argparse accepts)."""
    out, skip = [], False
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if skip or (len(flag) >= 5 and "--n-trials".startswith(flag)):
            skip = not skip and "=" not in arg
            continue
        out.append(arg)
    return [*out, "--n-trials", str(n)]


def _check_warm_start(cfg: Config, args: argparse.Namespace) -> WarmStart:
    """What `--enqueue` and `--from-study` bring, checked before the study is touched."""
    if args.from_storage and not args.from_study:
        raise ConfigError("--from-storage needs --from-study NAME")
    if not (args.enqueue or args.from_study):
        return [], [], None
    dims = check_search(cfg)
    # The store the study will use (prepare resolves it the same way): its runs' values.
    tracker = tracker_for(resolve_uri(args.tracking_uri or cfg.tracking.uri))
    queued = warm.run_values(cfg, dims, tracker, args.enqueue)
    copied = []
    if args.from_study:
        here = args.storage or default_storage()
        storage = args.from_storage or here
        warm.check_not_itself(args.study or cfg.name, here, args.from_study, storage)
        copied = warm.trials_of(cfg, dims, args.from_study, open_storage(storage))
    return queued, copied, args.from_study


def _set_up(cfg: Config, args: argparse.Namespace,
            warm_start: WarmStart) -> tuple[Study, TuneJob, Tracker]:
    """The study, its parent run and its first trials, as one step: a stop that arrives
    during it is acted on once it is done, so a study is never left half made (the parent
    run then ends KILLED, the queued trials wait for the next `accel tune`). Returns the
    command's tracker too, made inside the step, where a stop cannot cut it short."""
    study = job = tracker = None
    try:
        with signals.deferred_stops():
            study, job = prepare(cfg, args.study or cfg.name, args.storage, args.tracking_uri,
                                 queued=warm_start[0], node=True)
            tracker = tracker_for(job.tracking_uri)
            _warm_start(study, job, tracker, warm_start)
            job.workers = args.workers
            job.deadline = time.time() + args.timeout if args.timeout else None
        return study, job, tracker
    except BaseException as e:  # a stop, or a failure after the parent run was opened
        if job is not None:
            end_lease(study, job.invocation)
            _finish_parent(tracker if tracker is not None else tracker_for(job.tracking_uri),
                           study, job, "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise


def _warm_start(study: Study, job: TuneJob, tracker: Tracker, warm_start: WarmStart) -> None:
    """Queue the runs' values, add the other study's trials; say so, and tag the parent run."""
    queued, copied, origin = warm_start
    lines = [f"queued the values of run {run_id}: {params}" for run_id, params in queued]
    if copied:
        added = warm.add_trials(study, copied)
        lines.append(f"copied {added} finished trial(s) of study {origin} "
                     f"({len(copied) - added} already here)")
    for line in lines:
        note(line)
    if lines:
        retry_locked(tracker.set_tags, job.parent_run_id,
                     {"accel.warm_start": "; ".join(lines)[:record.MAX_TAG_CHARS]})


def _run_node(study: Study, job: TuneJob, tracker: Tracker, n_trials: int) -> int:
    """This node's trials, under its lease on the study; after Ctrl-C or SIGTERM its
    unfinished trials are closed."""
    with NodeLease(study, job.invocation):
        try:
            orphans = (clean_up(study, tracker, None) if is_journal(job.storage)
                       else fail_stale(study))
            close_what_was_left(study, tracker)
            progress(_start_line(study, job, n_trials, orphans))
            return run_workers(job, n_trials, study, tracker) if n_trials else 0
        finally:
            signals.ignore_stops()  # a second stop must not cut the clean-up short
            _clean_up(study, tracker, job.invocation)


def _clean_up(study: Study, tracker: Tracker, invocation: str) -> None:
    """This invocation's unfinished trials closed; a store away (a stop ends the wait for it)
    leaves them to the next invocation or `accel best`, with a warning, not a traceback."""
    try:
        clean_up(study, tracker, invocation)
    except Exception as e:
        warn(f"this invocation's unfinished trials could not be closed now ({one_line(e)}); "
             "the next `accel tune` or `accel best` on the study closes them")


def _start_line(study: Study, job: TuneJob, n_trials: int, orphans: int) -> str:
    """The line `accel tune` starts with: how many trials on how many workers, where."""
    before = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
    retried = f", {orphans} orphaned marked FAIL and queued again" if orphans else ""
    return (f"study {job.study}: {n_trials} trial(s) on {job.workers} worker(s); "
            f"{before} finished so far{retried}; "
            f"storage {redact(job.storage)}; MLflow {redact(job.tracking_uri)} "
            f"(experiment {job.study}, parent run {job.parent_run_id})")


def _finish_parent(tracker: Tracker, study: Study, job: TuneJob, status: str) -> None:
    """Update the parent run; end it unless another node still works on the study."""
    try:
        record.update_parent(tracker, study, job.parent_run_id, plots=True)
    finally:
        others = live_nodes(study, exclude=job.invocation)
        if others:
            note(f"the study's parent run stays RUNNING: {len(others)} other node(s) still "
                 "work on the study; the last one to end finishes it")
        else:
            retry_locked(tracker.end_run, job.parent_run_id, status)


def _failed_only(study: Study, invocation: str) -> bool:
    """This invocation completed no trial and failed at least one: pruned trials are the
    pruner's verdict, not failures."""
    mine = [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(record.ATTR_INVOCATION) == invocation]
    complete = set(record.complete_states())
    return (not any(t.state in complete for t in mine)
            and any(t.state.name == "FAIL" for t in mine))


def _study_summary(study: Study, job: TuneJob, tracker: Tracker) -> str:
    """The line `accel tune` ends with: this invocation's trials, the best, what to run next."""
    mine = [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(record.ATTR_INVOCATION) == job.invocation]
    counts = {s: sum(t.state.name == s for t in mine) for s in ("COMPLETE", "PRUNED", "FAIL")}
    best = record.best_trial(study)
    best_text = (f"best {job.cfg.search.metric}={best.value:.4f} (trial {best.number})"
                 if best else "no complete trial yet")
    if best is not None and (at_chance := chance.of_run(
            tracker, best.user_attrs.get(record.ATTR_RUN),
            job.cfg.search.metric, best.value)):
        best_text += f" (warning: {at_chance})"
    if pareto.is_multi(study):
        best_text = f"Pareto front: {len(pareto.front(study))} trial(s)"
    return (f"study {job.study}: this run {len(mine)} trial(s) ({counts['COMPLETE']} complete, "
            f"{counts['PRUNED']} pruned, {counts['FAIL']} failed); {len(study.trials)} in all; "
            f"{best_text}. See `{program()} best --study {job.study}"
            f"{storage_flag(job.storage)}`")
