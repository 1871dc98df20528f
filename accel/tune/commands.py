"""The `accel tune` and `accel best` commands."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

from accel import signals
from accel.config import Config, ConfigError
from accel.console import note, program, progress, quiet_libraries, warn
from accel.errors import one_line
from accel.tracking import retry_locked, tracker_for
from accel.tracking.store import browse_hint
from accel.tune import chance, pareto, warm
from accel.tune import tracking as st
from accel.tune.best_view import best_lines, print_front
from accel.tune.nodes import NodeLease, end_lease, finish_abandoned_parent, live_nodes
from accel.tune.space import check_search
from accel.tune.storage import default_storage, is_journal, open_storage
from accel.tune.study import (
    ATTR_DEFINITION,
    ATTR_TRACKING,
    TuneJob,
    check_study_name,
    prepare,
)
from accel.tune.workers import clean_up, fail_stale, queue_unexplained, run_workers
from accel.uris import DEFAULT_URI, redact, resolve_uri


def cli_tune(args, cfg: Config) -> int:
    """`accel tune`: prepare the study and its parent run, run this node's trials, close what
    is left; the parent run is finished by the last node to end."""
    n_trials = args.n_trials if args.n_trials is not None else cfg.search.n_trials
    if n_trials < 0:
        raise ConfigError(f"--n-trials {n_trials}: must be >= 0 (0: create the study only)")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be >= 1")
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError(f"--timeout {args.timeout}: must be > 0 seconds")
    quiet_libraries(study=True)
    warm_start = _check_warm_start(cfg, args)  # bad run ids and studies: before anything
    status, code = "FAILED", 1
    study, job = _set_up(cfg, args, warm_start)
    try:  # from the end of set-up on, a stop ends this node's trials and the parent run KILLED
        code = _run_node(study, job, n_trials)
        status = "FINISHED" if code == 0 else "FAILED"
    except KeyboardInterrupt:
        status, code = "KILLED", signals.exit_code()
    finally:
        signals.ignore_stops()  # let the clean-up finish
        try:
            _finish_parent(tracker_for(job.tracking_uri), study, job, status)
        except Exception as e:  # a store away: the next `accel tune` or `accel best` ends it
            warn(f"could not end the study's parent run {job.parent_run_id}: {one_line(e)}")
    if status != "KILLED":  # the study's page (accel report), its path said
        from accel.report.write import after_study
        after_study(study, job.tracking_uri, job.storage)
    progress(summary(study, job))
    if status == "KILLED":
        again = _carry_on(study, job, n_trials)
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


def _carry_on(study, job: TuneJob, n_trials: int) -> str:
    """The command that runs the trials this invocation had left (the stopped trial among
    them), and what became of the study's parent run."""
    mine = [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(st.ATTR_INVOCATION) == job.invocation]
    # Done: complete, pruned, or failed by its own error (a stopped trial carries none).
    done = sum(t.state.name in ("COMPLETE", "PRUNED")
               or (t.state.name == "FAIL" and st.ATTR_ERROR in t.user_attrs
                   and not t.user_attrs.get(st.ATTR_STOPPED)) for t in mine)
    left = max(n_trials - done, 0)
    argv = signals.command or [program(), "tune", "--study", job.study]
    command = shlex.join(_with_n_trials(argv, left))
    try:
        parent = tracker_for(job.tracking_uri).client.get_run(job.parent_run_id).info.status
        became = (f"the study's parent run {job.parent_run_id} is {parent}; that command "
                  "marks it RUNNING again and adds its trials to it")
    except Exception:  # the store away: the run's state is what the lines above said
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


def _check_warm_start(cfg: Config, args) -> tuple[list, list, str | None]:
    if args.from_storage and not args.from_study:
        raise ConfigError("--from-storage needs --from-study NAME")
    if not (args.enqueue or args.from_study):
        return [], [], None
    dims = check_search(cfg)
    queued = warm.run_values(cfg, dims, tracker_for(resolve_uri(args.tracking_uri
                                                                or cfg.tracking.uri)),
                             args.enqueue)
    copied = []
    if args.from_study:
        here = args.storage or default_storage()
        storage = args.from_storage or here
        warm.check_not_itself(args.study or cfg.name, here, args.from_study, storage)
        copied = warm.trials_of(cfg, dims, args.from_study, open_storage(storage))
    return queued, copied, args.from_study


def _set_up(cfg: Config, args, warm_start: tuple[list, list, str | None]):
    """The study, its parent run and its first trials, as one step: a stop that arrives
    during it is acted on once it is done, so a study is never left half made (the parent
    run then ends KILLED, the queued trials wait for the next `accel tune`)."""
    study = job = None
    try:
        with signals.deferred_stops():
            study, job = prepare(cfg, args.study or cfg.name, args.storage, args.tracking_uri,
                                 queued=warm_start[0], node=True)
            _warm_start(study, job, warm_start)
            job.workers = args.workers
            job.deadline = time.time() + args.timeout if args.timeout else None
            tracker_for(job.tracking_uri)  # made here, where a stop cannot cut it short
        return study, job
    except BaseException as e:  # a stop, or a failure after the parent run was opened
        if job is not None:
            end_lease(study, job.invocation)
            _finish_parent(tracker_for(job.tracking_uri), study, job,
                           "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise


def _warm_start(study, job: TuneJob, warm_start: tuple[list, list, str | None]) -> None:
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
        tracker = tracker_for(job.tracking_uri)
        retry_locked(tracker.set_tags, job.parent_run_id,
                     {"accel.warm_start": "; ".join(lines)[:st.MAX_TAG_CHARS]})


def _run_node(study, job: TuneJob, n_trials: int) -> int:
    """This node's trials, under its lease on the study; after Ctrl-C or SIGTERM its
    unfinished trials are closed."""
    tracker = tracker_for(job.tracking_uri)
    with NodeLease(study, job.invocation):
        try:
            orphans = (clean_up(study, tracker, None) if is_journal(job.storage)
                       else fail_stale(study))
            _close_left_running(study, tracker)
            progress(_start_line(study, job, n_trials, orphans))
            return run_workers(job, n_trials, study, tracker) if n_trials else 0
        finally:
            signals.ignore_stops()  # let the clean-up finish
            _clean_up(study, tracker, job.invocation)


def _clean_up(study, tracker, invocation: str) -> None:
    """This invocation's unfinished trials closed; a store away (a stop ends the wait for it)
    leaves them to the next invocation or `accel best`, with a warning, not a traceback."""
    try:
        clean_up(study, tracker, invocation)
    except Exception as e:
        warn(f"this invocation's unfinished trials could not be closed now ({one_line(e)}); "
             "the next `accel tune` or `accel best` on the study closes them")


def _close_left_running(study, tracker) -> None:
    """What a dead or stopped process, or a store away, left: stopped trials not yet queued
    again are queued, trial runs left RUNNING (or never made) are closed; said once."""
    queued = queue_unexplained(study)
    if queued:
        note(f"queued again the stopped trial(s) {', '.join(map(str, queued))}")
    closed = st.close_left_running(tracker, study)
    if closed:
        note(f"closed the MLflow runs left RUNNING (or never made) of finished trial(s) "
             f"{', '.join(map(str, closed))}")


def _start_line(study, job: TuneJob, n_trials: int, orphans: int) -> str:
    before = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
    retried = f", {orphans} orphaned marked FAIL and queued again" if orphans else ""
    return (f"study {job.study}: {n_trials} trial(s) on {job.workers} worker(s); "
            f"{before} finished so far{retried}; "
            f"storage {redact(job.storage)}; MLflow {redact(job.tracking_uri)} "
            f"(experiment {job.study}, parent run {job.parent_run_id})")


def _finish_parent(tracker, study, job: TuneJob, status: str) -> None:
    """Update the parent run; end it unless another node still works on the study."""
    try:
        st.update_parent(tracker, study, job.parent_run_id, plots=True)
    finally:
        others = live_nodes(study, exclude=job.invocation)
        if others:
            note(f"the study's parent run stays RUNNING: {len(others)} other node(s) still "
                 "work on the study; the last one to end finishes it")
        else:
            retry_locked(tracker.end_run, job.parent_run_id, status)


def _failed_only(study, invocation: str) -> bool:
    """This invocation completed no trial and failed at least one: pruned trials are the
    pruner's verdict, not failures."""
    mine = [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(st.ATTR_INVOCATION) == invocation]
    complete = set(st.complete_states())
    return (not any(t.state in complete for t in mine)
            and any(t.state.name == "FAIL" for t in mine))


def summary(study, job: TuneJob) -> str:
    mine = [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(st.ATTR_INVOCATION) == job.invocation]
    counts = {s: sum(t.state.name == s for t in mine) for s in ("COMPLETE", "PRUNED", "FAIL")}
    best = st.best_trial(study)
    best_text = (f"best {job.cfg.search.metric}={best.value:.4f} (trial {best.number})"
                 if best else "no complete trial yet")
    if best is not None and (at_chance := chance.of_run(
            tracker_for(job.tracking_uri), best.user_attrs.get(st.ATTR_RUN),
            job.cfg.search.metric, best.value)):
        best_text += f" (warning: {at_chance})"
    if pareto.is_multi(study):
        best_text = f"Pareto front: {len(pareto.front(study))} trial(s)"
    return (f"study {job.study}: this run {len(mine)} trial(s) ({counts['COMPLETE']} complete, "
            f"{counts['PRUNED']} pruned, {counts['FAIL']} failed); {len(study.trials)} in all; "
            f"{best_text}. See `{program()} best --study {job.study}"
            f"{_storage_flag(job.storage)}`")


def _storage_flag(storage: str) -> str:
    return "" if storage == default_storage() else f" --storage {shlex.quote(redact(storage))}"


def load_existing_study(name: str, storage_url: str | None):
    """A study that must already exist (`accel best`): a ConfigError naming the studies there."""
    import optuna

    check_study_name(name)
    storage_url = storage_url or default_storage()
    if is_journal(storage_url) and not Path(storage_url).is_file():
        raise ConfigError(f"no Optuna storage at {storage_url}: run `accel tune` first, or "
                          "pass --storage")
    storage = open_storage(storage_url)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = sorted(optuna.get_all_study_names(storage=storage))
        raise ConfigError(f"no study '{name}' in {redact(storage_url)}; studies there: "
                          f"{', '.join(names) or 'none'}") from None


def cli_best(args) -> int:
    """`accel best`: the best COMPLETE trial, its MLflow run, and the command that reruns it."""
    quiet_libraries(study=True)
    if args.register:
        from accel.registry import check_name

        check_name(args.register, args.alias)
    name = args.study
    study = load_existing_study(name, args.storage)
    uri = args.tracking_uri or study.user_attrs.get(ATTR_TRACKING) or resolve_uri(None)
    _close_left_running(study, tracker_for(uri))
    abandoned = finish_abandoned_parent(study, tracker_for(uri))
    if abandoned:
        note(f"the study's parent run {abandoned} was RUNNING with no node left on the study "
             "(every lease ended or expired): marked FAILED")
    best, metric = _chosen(study, args)
    verification = _verification(study, tracker_for(uri), args)
    if args.verified and best is not None:
        best = next(t for t in study.trials if t.number == int(verification.data.tags[
            "accel.verified_best"]))
    states = [t.state.name for t in study.trials]
    counts = ", ".join(f"{states.count(s)} {word}" for s, word in
                       (("COMPLETE", "complete"), ("PRUNED", "pruned"), ("FAIL", "failed")))
    if best is None:
        progress(f"study {name}: no complete trial yet ({len(states)} trials: {counts})")
        return 1
    reproduce = _reproduce_command(tracker_for(uri), name, uri)
    command, run_id = reproduce(best)
    at_chance = _at_chance(study, best, metric, tracker_for(uri), run_id, args)
    if pareto.is_multi(study) and not (args.pick or args.brief):
        print_front(study, counts, reproduce, _storage_flag(args.storage or default_storage()))
        return 0
    experiment = tracker_for(uri).client.get_experiment_by_name(name)
    browse = f"browse: {browse_hint(uri, experiment.experiment_id)}" if experiment else None
    if args.brief:
        lines = [f"study {name}: {len(states)} trials ({counts}); best {metric} "
                 f"{_value(study, best, metric):.4g} (trial {best.number})", browse,
                 f"reproduce: {command}"]
    else:
        lines = best_lines(name, states, counts, best, metric, _value(study, best, metric),
                            run_id, uri, command) + [browse]
        if verification is not None:
            lines += st.verified_lines(tracker_for(uri), verification)
    print("\n".join(line for line in lines if line))
    if at_chance:
        warn(at_chance)
    if args.register:
        _register(args, tracker_for(uri), study, best, metric, run_id, verification, uri)
    return 0


def _register(args, tracker, study, best, metric: str, run_id: str, verification,
              uri: str) -> None:
    """`--register`: the trial's weights as a new version of the model, the alias moved."""
    from accel import registry

    done = registry.register(tracker, run_id, args.register, args.alias, tags={
        "accel.study": study.study_name, "optuna.trial_number": str(best.number),
        "accel.metric": metric, "accel.value": f"{_value(study, best, metric):.6g}",
        **({"accel.verify_run": verification.info.run_id} if args.verified else {})})
    if args.verified:
        print(f"registered trial {best.number}, the verified best (accel verify run "
              f"{verification.info.run_id}), with the weights of its own tuning run "
              f"{run_id} (checkpoint/best.pt)")
    print(f"registered: models:/{done.name}@{done.alias} (version {done.version}, "
          f"{done.serialization}); evaluate: {program()} evaluate "
          f"models:/{done.name}@{done.alias}"
          + (f" --tracking-uri {shlex.quote(redact(uri))}" if uri != DEFAULT_URI else ""))


def _at_chance(study, best, metric: str, tracker, run_id: str, args) -> str | None:
    """Why the best value is within noise of chance (accel.tune.chance), or None; with
    --register and no --force, such a trial is refused (exit 2)."""
    if pareto.is_multi(study):
        return None
    said = chance.of_run(tracker, run_id, metric, _value(study, best, metric))
    if said and args.register and not args.force:
        raise ConfigError(f"study {study.study_name}: not registering trial {best.number}: "
                          f"{said}; add --force to register it anyway")
    return said


def _verification(study, tracker, args):
    """The study's last finished `accel verify` run, or None; `--verified` needs one."""
    run = st.latest_verification(tracker, study.study_name)
    if args.verified and run is None:
        raise ConfigError(f"--verified: study '{study.study_name}' has no finished "
                          f"verification; run `accel verify --study {study.study_name}` first")
    return run


def _chosen(study, args) -> tuple[Any, str]:
    """The trial `accel best` names and its metric: the best trial; in a multi-objective study
    the front's best on `--pick METRIC` (the first objective by default)."""
    if not pareto.is_multi(study):
        metric = study.user_attrs.get(ATTR_DEFINITION, {}).get("metric", "value")
        if args.pick and args.pick != metric:
            raise ConfigError(f"--pick {args.pick}: study '{study.study_name}' has one "
                              f"objective, {metric}")
        return st.best_trial(study), metric
    metric = args.pick or pareto.objective_names(study)[0]
    front = pareto.front(study)
    if args.register and not args.pick:
        raise ConfigError(f"study '{study.study_name}' has a Pareto front, not one best trial: "
                          f"add --pick METRIC ({', '.join(pareto.objective_names(study))})")
    return (pareto.pick(study, front, metric) if front else None), metric


def _value(study, trial, metric: str) -> float:
    if not pareto.is_multi(study):
        return trial.value
    return trial.values[pareto.objective_names(study).index(metric)]


def _reproduce_command(tracker, name: str, uri: str):
    def command(trial) -> tuple[str, str]:
        run_id = trial.user_attrs.get(st.ATTR_RUN) or st.find_trial_run(tracker, name,
                                                                         trial.number)
        flag = f" --tracking-uri {shlex.quote(redact(uri))}" if uri != DEFAULT_URI else ""
        return f"{program()} reproduce {run_id}{flag}", run_id

    return command
