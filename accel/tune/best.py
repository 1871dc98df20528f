"""`accel best`: a study's best trial (or its Pareto front), its MLflow run and the command that
reruns it; `--register` logs its weights as a registered model. Also what every command that
reads an existing study shares: loading it, and closing what dead or stopped processes left."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from accel.config import ConfigError
from accel.console import note, program, progress, quiet_libraries, warn
from accel.tracking import Tracker, tracker_for
from accel.tracking.store import browse_hint
from accel.tune import chance, pareto
from accel.tune import study_record as record
from accel.tune.best_view import best_lines, print_front, speed_line
from accel.tune.nodes import finish_abandoned_parent
from accel.tune.storage import default_storage, is_journal, open_storage
from accel.tune.study import ATTR_DEFINITION, ATTR_TRACKING, check_study_name
from accel.tune.workers import queue_unexplained
from accel.uris import DEFAULT_URI, redact, resolve_uri

if TYPE_CHECKING:  # Optuna's and MLflow's types only: importing them here would slow the CLI
    import argparse

    from mlflow.entities import Run
    from optuna import Study
    from optuna.trial import FrozenTrial


def load_existing_study(name: str, storage_url: str | None) -> Study:
    """A study that must already exist (`accel best`, `verify`, `report`): a ConfigError
    naming the studies there."""
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


def close_what_was_left(study: Study, tracker: Tracker) -> None:
    """What a dead or stopped process, or a store away, left: stopped trials not yet queued
    again are queued, trial runs left RUNNING (or never made) are closed; said once. Every
    `accel tune` and `accel best` looks again."""
    queued = queue_unexplained(study)
    if queued:
        note(f"queued again the stopped trial(s) {', '.join(map(str, queued))}")
    closed = record.close_left_running(tracker, study)
    if closed:
        note(f"closed the MLflow runs left RUNNING (or never made) of finished trial(s) "
             f"{', '.join(map(str, closed))}")


def storage_flag(storage: str) -> str:
    """The `--storage` a printed command needs: none for the default storage."""
    return "" if storage == default_storage() else f" --storage {shlex.quote(redact(storage))}"


def cli_best(args: argparse.Namespace) -> int:
    """`accel best`: the best COMPLETE trial, its MLflow run, and the command that reruns it."""
    quiet_libraries(study=True)
    if args.register:  # torch comes with accel.registry: only a registering command loads it
        from accel.registry import check_name

        check_name(args.register, args.alias)
    name = args.study
    study = load_existing_study(name, args.storage)
    uri = args.tracking_uri or study.user_attrs.get(ATTR_TRACKING) or resolve_uri(None)
    tracker = tracker_for(uri)
    close_what_was_left(study, tracker)
    abandoned = finish_abandoned_parent(study, tracker)
    if abandoned:
        note(f"the study's parent run {abandoned} was RUNNING with no node left on the study "
             "(every lease ended or expired): marked FAILED")
    best, metric = _chosen(study, args)
    verification = _verification(study, tracker, args)
    if args.verified and best is not None:
        best = next(t for t in study.trials if t.number == int(verification.data.tags[
            "accel.verified_best"]))
    states = [t.state.name for t in study.trials]
    counts = ", ".join(f"{states.count(s)} {word}" for s, word in
                       (("COMPLETE", "complete"), ("PRUNED", "pruned"), ("FAIL", "failed")))
    if best is None:
        progress(f"study {name}: no complete trial yet ({len(states)} trials: {counts})")
        return 1
    reproduce = _reproduce_command(tracker, name, uri)
    command, run_id = reproduce(best)
    at_chance = _at_chance(study, best, metric, tracker, run_id, args)
    if pareto.is_multi(study) and not (args.pick or args.brief):
        print_front(study, counts, reproduce, storage_flag(args.storage or default_storage()))
        return 0
    experiment = tracker.client.get_experiment_by_name(name)
    browse = f"browse: {browse_hint(uri, experiment.experiment_id)}" if experiment else None
    if args.brief:
        lines = [f"study {name}: {len(states)} trials ({counts}); best {metric} "
                 f"{_value(study, best, metric):.4g} (trial {best.number})", browse,
                 f"reproduce: {command}"]
    else:
        lines = best_lines(name, states, counts, best, metric, _value(study, best, metric),
                           run_id, uri, command) + [_speed(tracker, run_id), browse]
        if verification is not None:
            lines += record.verified_lines(tracker, verification)
    print("\n".join(line for line in lines if line))
    if at_chance:
        warn(at_chance)
    if args.register:
        _register(args, tracker, study, best, metric, run_id, verification, uri)
    return 0


def _register(args: argparse.Namespace, tracker: Tracker, study: Study, best: FrozenTrial,
              metric: str, run_id: str, verification: Run | None, uri: str) -> None:
    """`--register`: the trial's weights as a new version of the model, the alias moved."""
    from accel import registry  # torch comes with it: loaded only when registering

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


def _at_chance(study: Study, best: FrozenTrial, metric: str, tracker: Tracker, run_id: str,
               args: argparse.Namespace) -> str | None:
    """Why the best value is within noise of chance (accel.tune.chance), or None; with
    --register and no --force, such a trial is refused (exit 2)."""
    if pareto.is_multi(study):
        return None
    said = chance.of_run(tracker, run_id, metric, _value(study, best, metric))
    if said and args.register and not args.force:
        raise ConfigError(f"study {study.study_name}: not registering trial {best.number}: "
                          f"{said}; add --force to register it anyway")
    return said


def _verification(study: Study, tracker: Tracker, args: argparse.Namespace) -> Run | None:
    """The study's last finished `accel verify` run, or None; `--verified` needs one."""
    run = record.latest_verification(tracker, study.study_name)
    if args.verified and run is None:
        raise ConfigError(f"--verified: study '{study.study_name}' has no finished "
                          f"verification; run `accel verify --study {study.study_name}` first")
    return run


def _chosen(study: Study, args: argparse.Namespace) -> tuple[FrozenTrial | None, str]:
    """The trial `accel best` names and its metric: the best trial; in a multi-objective study
    the front's best on `--pick METRIC` (the first objective by default)."""
    if not pareto.is_multi(study):
        metric = study.user_attrs.get(ATTR_DEFINITION, {}).get("metric", "value")
        if args.pick and args.pick != metric:
            raise ConfigError(f"--pick {args.pick}: study '{study.study_name}' has one "
                              f"objective, {metric}")
        return record.best_trial(study), metric
    metric = args.pick or pareto.objective_names(study)[0]
    front = pareto.front(study)
    if args.register and not args.pick:
        raise ConfigError(f"study '{study.study_name}' has a Pareto front, not one best trial: "
                          f"add --pick METRIC ({', '.join(pareto.objective_names(study))})")
    return (pareto.pick(study, front, metric) if front else None), metric


def _value(study: Study, trial: FrozenTrial, metric: str) -> float:
    if not pareto.is_multi(study):
        return trial.value
    return trial.values[pareto.objective_names(study).index(metric)]


def _reproduce_command(tracker: Tracker, name: str,
                       uri: str) -> Callable[[FrozenTrial], tuple[str, str]]:
    """A trial -> (the `accel reproduce` command of its run, the run id)."""
    def command(trial: FrozenTrial) -> tuple[str, str]:
        run_id = (trial.user_attrs.get(record.ATTR_RUN)
                  or record.find_trial_run(tracker, name, trial.number))
        flag = f" --tracking-uri {shlex.quote(redact(uri))}" if uri != DEFAULT_URI else ""
        return f"{program()} reproduce {run_id}{flag}", run_id

    return command


def _speed(tracker: Tracker, run_id: str | None) -> str | None:
    """The best run's time split and MFU, where its run can be read."""
    try:
        return speed_line(tracker.client.get_run(run_id)) if run_id else None
    except Exception:  # a deleted run, a store gone meanwhile: the rest of the answer stands
        return None
