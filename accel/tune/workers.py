"""Running trials: the worker loop (claim a slot, run one trial, update the parent run), worker
processes on one study, Ctrl-C, and closing trials left RUNNING.

`--n-trials` counts for the whole invocation: the workers share one `TrialSlots`. With one worker
the loop runs in this process; with several, in spawned processes (CUDA and some BLAS builds cannot
be used in a forked child), each with `cores / N` torch threads and its own GPU where several
exist. A worker process that dies (SIGKILL, the out-of-memory killer) has its trial failed and
queued again at once, to carry on from its checkpoint, and is replaced while trials are left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
import warnings

from accel import outage
from accel.config import ConfigError
from accel.console import notes_held, progress, quiet_libraries, warn
from accel.errors import one_line
from accel.signals import handle_stops, ignore_stops, stop_requested
from accel.tracking import retry_locked
from accel.tune import pareto
from accel.tune import study_record as record
from accel.tune.nodes import process_alive
from accel.tune.objective import Objective
from accel.tune.one_trial import run_one_trial
from accel.tune.storage import MAX_RETRY, RetryStaleTrial, open_storage
from accel.tune.study import (
    TuneJob,
    build_pruner,
    build_sampler,
    worker_seed,
)


class TrialSlots:
    """`--n-trials` for the whole invocation: worker processes claim slots from one counter."""

    def __init__(self, n: int, context=None):
        import multiprocessing

        self.n = n
        self.used = (context or multiprocessing).Value("i", 0)

    def claim(self) -> bool:
        with self.used.get_lock():
            if self.used.value >= self.n:
                return False
            self.used.value += 1
            return True

    def give_back(self) -> None:
        """The slot of a trial queued again after its worker died: the retry takes it."""
        with self.used.get_lock():
            self.used.value -= 1

    def left(self) -> bool:
        with self.used.get_lock():
            return self.used.value < self.n


def run_worker(job: TuneJob, index: int, slots: TrialSlots, restart: int = 0) -> None:
    """Claim a trial slot, run one trial, repeat; the study's parent run is updated after each.
    `restart` counts the workers that took this one's place: each samples with its own seed."""
    import optuna

    for store in (job.storage, job.tracking_uri):  # the invocation reached both, so an outage
        outage.mark_reached(store)  # of either is waited for (accel.outage)
    study = optuna.load_study(
        study_name=job.study,
        storage=open_storage(job.storage, on_stale=RetryStaleTrial(job.tracking_uri)),
        sampler=build_sampler(job.cfg.search.sampler, worker_seed(job.seed, restart, index)),
        pruner=build_pruner(job.cfg.search.pruner, job.cfg.train.epochs),
    )
    objective = Objective(job)
    prefix = f"[worker {index}] " if job.workers > 1 else ""
    last_plots = [time.time() - record.PLOT_EVERY_S / 2]  # the first plots wait a few trials

    def after_trial(study, trial) -> None:
        progress(prefix + describe_trial(study, trial, job.cfg.search.metric))
        plots = time.time() - last_plots[0] >= record.PLOT_EVERY_S
        try:
            record.update_parent(objective.tracker, study, job.parent_run_id, plots=plots)
            last_plots[0] = time.time() if plots else last_plots[0]
        except Exception as e:
            warn(f"could not update the study run: {one_line(e)}")

    while slots.claim():
        if job.deadline is not None and time.time() >= job.deadline:
            break
        try:
            if run_one_trial(study, objective, after_trial, prefix) is None:
                slots.give_back()  # the trial went to its retry, which takes the slot
        except KeyboardInterrupt:
            _queue_stopped(study, objective.last_trial)
            raise
        if stop_requested():  # a stop reached the trial as another error
            _queue_stopped(study, objective.last_trial)
            raise KeyboardInterrupt
        if objective.bad_input is not None:
            raise objective.bad_input
        if objective.unavailable is not None:  # a store stayed away past the outage window
            number, error = objective.unavailable
            trial = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
            if trial.state.is_finished() and _queue_again(study, trial):
                warn(f"trial {trial.number} is queued again: {one_line(error)}")
            raise error


def _queue_stopped(study, number: int | None) -> None:
    """The trial a stop (Ctrl-C, SIGTERM: a preemption, a time limit) ended FAIL is queued again,
    like a dead worker's: the next worker or invocation carries it on from its checkpoint."""
    from optuna.trial import TrialState

    if number is None:
        return
    try:
        trials = study.get_trials(deepcopy=False)
        trial = next((t for t in trials if t.number == number), None)
        if trial is None or trial.state != TrialState.FAIL or number in record.retried(trials):
            return  # the stop did not end it (the clean-up closes a RUNNING one), or it is queued
        _queue_again(study, trial)
    except Exception as e:  # the store is away: the next invocation queues it
        warn(f"trial {number} could not be queued again now: {one_line(e)}")


def describe_trial(study, trial, metric: str) -> str:
    """The line a worker prints when a trial ends: its state, value or error, and the best."""
    took = f" in {trial.duration.total_seconds():.1f}s" if trial.duration else ""
    if trial.state.name == "COMPLETE" and pareto.is_multi(study):
        what = pareto.named_values(study, trial.values)
    elif trial.state.name == "COMPLETE":
        what = f"{metric}={trial.value:.4f}"
    elif trial.state.name == "PRUNED":
        what = f"at epoch {trial.last_step}" if trial.last_step is not None else ""
    else:
        what = trial.user_attrs.get(record.ATTR_ERROR, "")
    best = record.best_trial(study)
    tail = f"; best {best.value:.4f} (trial {best.number})" if best else ""
    if pareto.is_multi(study):
        tail = f"; Pareto front: {len(pareto.front(study))} trial(s)"
    return f"trial {trial.number:03d} {trial.state.name} {what}{took}{tail}"


# --- worker processes, Ctrl-C and SIGTERM ---------------------------------------------------------


def _worker_main(job: TuneJob, index: int, restart: int, slots: TrialSlots,
                 env: dict[str, str]) -> None:
    """Entry of a spawned worker process; its exit code tells the main process how it ended."""
    os.environ.update(env)  # sets which GPU this worker sees, before torch is imported
    handle_stops()  # Ctrl-C and SIGTERM (sent to the whole process group) stop it cleanly
    quiet_libraries(study=True)
    try:
        import torch

        # Share the CPU cores instead of oversubscribing them (n workers x all cores each).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // job.workers))
        with notes_held():  # notes come after this worker's trial lines, not between them
            run_worker(job, index, slots, restart)
    except KeyboardInterrupt:
        sys.exit(130)
    except ConfigError as e:
        print(f"accel: error: {e}", file=sys.stderr)
        sys.exit(2)
    except outage.StoreUnavailable as e:
        print(f"accel: error: {e}", file=sys.stderr)
        sys.exit(1)


def _gpu_envs(workers: int, device: str) -> list[dict[str, str]]:
    """One GPU per worker (round robin) where there are several; nothing to set otherwise."""
    if device == "cpu":
        return [{} for _ in range(workers)]
    import torch

    count = torch.cuda.device_count()
    if count < 2:
        return [{} for _ in range(workers)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(count)]
    return [{"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]} for i in range(workers)]


def run_workers(job: TuneJob, n_trials: int, study, tracker) -> int:
    """Run the invocation's trials in this process (1 worker) or in spawned processes; a
    worker process that dies is replaced (at most `MAX_RETRY` times per trial of the
    invocation, as its trials are retried) while trials are left."""
    if job.workers == 1:
        with notes_held():  # notes come after the trial lines, not between them
            run_worker(job, 0, TrialSlots(n_trials))
        return 0
    import multiprocessing
    from multiprocessing.connection import wait

    # Spawned, not forked: CUDA and some BLAS builds cannot be used in a forked child.
    context = multiprocessing.get_context("spawn")
    slots = TrialSlots(n_trials, context)
    envs = _gpu_envs(job.workers, job.cfg.train.device)
    restarts = [0] * job.workers

    def start(i: int):
        p = context.Process(target=_worker_main, args=(job, i, restarts[i], slots, envs[i]),
                            name=f"accel-tune-{i}")
        p.start()
        return p

    live, codes = {i: start(i) for i in range(job.workers)}, []
    try:
        while live:
            wait([p.sentinel for p in live.values()])
            for i in [i for i, p in live.items() if not p.is_alive()]:
                p = live.pop(i)
                p.join()
                if p.exitcode is None or p.exitcode >= 0:  # it exited (0, 1, 2 or 130): no signal
                    codes.append(p.exitcode)
                    continue
                _retry_dead_worker(study, tracker, p, i, slots)
                if slots.left() and sum(restarts) < n_trials * MAX_RETRY:
                    restarts[i] += 1
                    live[i] = start(i)
    except KeyboardInterrupt:
        stop_processes(list(live.values()))
        raise
    if 130 in codes:
        raise KeyboardInterrupt
    if 2 in codes:
        return 2
    return 0 if all(c == 0 for c in codes) else 1


def stop_processes(procs, wait_s: float = 60.0) -> None:
    """Ctrl-C or SIGTERM reached this process: make sure the workers got it, wait, then kill
    them. Not SIGTERM: a stopping worker ignores it, and `multiprocessing` would then wait for it
    forever at exit. A killed worker's trial is closed by this process's clean-up."""
    ignore_stops()
    for p in procs:
        if p.is_alive() and p.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGINT)  # a worker ignores a second one
    deadline = time.time() + wait_s
    for p in procs:
        p.join(max(0.1, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join(5)


def _retry_dead_worker(study, tracker, proc, index: int, slots: TrialSlots) -> None:
    """A worker killed by a signal: its trial FAIL (MLflow FAILED) and queued again, which
    gives its slot back to the retry."""
    dead = [t for t in _running(study) if t.user_attrs.get(record.ATTR_PID) == proc.pid]
    numbers = []
    for t in dead:
        if _fail_and_retry(study, tracker, t, "its worker process died; the trial is queued "
                                               "again"):
            slots.give_back()
            numbers.append(str(t.number))
    queued = f"; trial {', '.join(numbers)} queued again" if numbers else ""
    how = signal.strsignal(-proc.exitcode) or f"signal {-proc.exitcode}"
    warn(f"worker {index} died ({how}){queued}")


# --- clean-up ---------------------------------------------------------------------------------


def clean_up(study, tracker, invocation: str | None) -> int:
    """Mark RUNNING trials FAIL and queue them again, to carry on from their last checkpoint:
    those of this invocation after Ctrl-C or SIGTERM (their MLflow runs KILLED: stopped, as a
    preemption or a time limit stops them), or, with `invocation=None`, those whose process on
    this host is gone (a killed run on a journal storage, which has no heartbeats: as a dead
    worker's trial on a database storage, MLflow FAILED). Returns how many were closed."""
    closed = 0
    for t in _running(study):
        if invocation is None:
            if _orphaned(t):
                _fail_and_retry(study, tracker, t, "its worker process is gone; the trial is "
                                                   "queued again")
                closed += 1
            continue
        if t.user_attrs.get(record.ATTR_INVOCATION) != invocation:
            continue
        _fail_and_retry(study, tracker, t, "interrupted", interrupted=True)
        closed += 1
    if invocation is not None:
        try:
            for run in record.search_runs(tracker, study.study_name,
                                      f"tags.`accel.invocation` = '{invocation}' AND "
                                      "attributes.status = 'RUNNING'"):
                retry_locked(tracker.set_tags, run.info.run_id, {"optuna.trial_state": "FAIL"})
                retry_locked(tracker.end_run, run.info.run_id, "KILLED")
        except Exception as e:  # the store is away: the next invocation or `accel best` closes them
            warn(f"could not close this invocation's runs: {one_line(e)}")
    return closed


def fail_stale(study) -> int:
    """Database storages: fail the trials whose workers stopped sending heartbeats and queue
    them again (the storage's callback closes their runs). Optuna does so when a worker starts
    a trial; an invocation does it at its start too, so that one with no trial to run still
    closes what dead workers left. Returns how many."""
    import optuna

    before = {t.number for t in _running(study)}
    with warnings.catch_warnings():  # Optuna 5 calls these APIs experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    return len(before - {t.number for t in _running(study)})


def _running(study) -> list:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def _fail_and_retry(study, tracker, trial, message: str, *, interrupted: bool = False) -> bool:
    """A trial whose process died or was stopped: FAIL, queued again with its values (as a
    database storage does after its heartbeats stop), its MLflow run FAILED (KILLED when
    stopped). Returns whether it was queued."""
    from optuna.trial import TrialState

    if interrupted:  # a later invocation that closes its run closes it KILLED too
        with contextlib.suppress(Exception):  # a trial that finished meanwhile had its run closed
            study._storage.set_trial_user_attr(trial._trial_id, record.ATTR_STOPPED, True)
    study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
    queued = _queue_again(study, trial)
    if queued:
        message += "; the trial is queued again" if "queued again" not in message else ""
    _close_run(tracker, study, trial, message, interrupted=interrupted)
    return queued


def queue_unexplained(study, settle_s: float = 5.0) -> list[int]:
    """Queue again the FAIL trials that nothing queued and that failed through no error of
    their own: stopped (Ctrl-C, SIGTERM), or ended without a word (a process killed between
    Optuna failing the trial and queuing it; a store away at that moment). A trial failed less
    than `settle_s` ago is left to whoever failed it. Within the retry limit. Returns them."""
    import datetime

    trials = study.get_trials(deepcopy=False)
    retried = record.retried(trials)
    now, queued = datetime.datetime.now(), []
    for t in trials:
        if t.state.name != "FAIL" or t.number in retried or record.ATTR_COPIED in t.user_attrs:
            continue
        if record.ATTR_ERROR in t.user_attrs and not t.user_attrs.get(record.ATTR_STOPPED):
            continue  # it failed by its own error, which a retry would meet again
        if t.datetime_complete and (now - t.datetime_complete).total_seconds() < settle_s:
            continue
        if _queue_again(study, t):
            queued.append(t.number)
    return queued


def _queue_again(study, trial) -> bool:
    """Queue a failed trial's values again (its retry carries on from its checkpoint), unless
    it was retried `MAX_RETRY` times already. Returns whether it was queued."""
    from optuna.exceptions import ExperimentalWarning
    from optuna.storages import RetryHeartbeatStaleTrialCallback as Retry

    with warnings.catch_warnings():  # Optuna 5 calls these APIs experimental
        warnings.simplefilter("ignore", ExperimentalWarning)
        queued = len(Retry.retry_history(trial)) < MAX_RETRY
        Retry(max_retry=MAX_RETRY)(study, trial)
    return queued


def _close_run(tracker, study, trial, message: str, *, interrupted: bool) -> None:
    try:
        record.close_dead_trial(tracker, study, trial, message, interrupted=interrupted)
    except Exception as e:  # the trial's state is what counts; its run only shows it
        warn(f"trial {trial.number}: {one_line(e)}")


def _orphaned(trial) -> bool:
    """A trial of a process on this host that no longer exists."""
    pid = trial.user_attrs.get(record.ATTR_PID)
    return (trial.user_attrs.get(record.ATTR_HOST) == socket.gethostname() and isinstance(pid, int)
            and not process_alive(pid))
