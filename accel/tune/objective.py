"""The objective: one trial is one `train()` run of the base config with the trial's values set,
logged as a child of the study's parent run. Every outcome (complete, pruned, failed, interrupted)
leaves exactly one MLflow run with the trial's state."""

from __future__ import annotations

import functools
import math
import os
import socket
import warnings
from pathlib import Path

from accel import lease, signals
from accel.config import COST_METRICS, ConfigError, objectives
from accel.console import note, warn
from accel.errors import describe_error, one_line
from accel.outage import StoreUnavailable
from accel.tracking import Tracker, retry_locked, scratch_dir, tracker_for
from accel.tune import study_record as record
from accel.tune.space import trial_config
from accel.tune.storage import MAX_RETRY
from accel.tune.study import TuneJob


class Objective:
    """Called by Optuna once per trial; returns the search metric of the trial's run."""

    def __init__(self, job: TuneJob):
        self.job = job
        self.bad_input: ConfigError | None = None  # stops the invocation: it would recur
        # (trial number, error): a store stayed away past the outage window; the worker queues
        # the trial again and ends the invocation
        self.unavailable: tuple[int, StoreUnavailable] | None = None
        self.last_trial: int | None = None  # the number of the trial called last

    @functools.cached_property
    def tracker(self) -> Tracker:
        """The store's tracker, made when a trial first needs it (`tracker_for`: one per store
        and process)."""
        return tracker_for(self.job.tracking_uri)

    def __call__(self, trial) -> float:
        import optuna

        job = self.job
        self.last_trial = trial.number
        state, run_id, error, interrupted = "FAIL", None, None, False
        try:
            # A stop ends the trial anywhere in here (one that came while Optuna asked for the
            # trial, at once); outside, accel.tune.one_trial raises it after the tell.
            with signals.live_stops():
                trial.set_user_attr(record.ATTR_INVOCATION, job.invocation)
                trial.set_user_attr(record.ATTR_HOST, socket.gethostname())
                trial.set_user_attr(record.ATTR_PID, os.getpid())
                cfg = trial_config(job.cfg, job.dims, trial)
                with scratch_dir() as tmp:
                    result = self._train(cfg, trial, self._resume_point(trial, Path(tmp)))
            run_id = result.run_id
            values = objective_values(result, objectives(job.cfg.search))
            state = "COMPLETE"
            return values[0] if len(values) == 1 else values
        except lease.LeaseLost:
            state = None  # another worker failed it meanwhile: that worker's close is its record
            raise
        except optuna.TrialPruned:
            state = "PRUNED"
            raise
        except ConfigError as e:
            self.bad_input, error = e, e
            raise
        except KeyboardInterrupt:
            interrupted = True
            raise
        except StoreUnavailable as e:
            self.unavailable, error = (trial.number, e), e
            raise
        except Exception as e:
            error = e
            _free_accelerator_memory()  # after an out-of-memory error the next trial needs it
            raise
        finally:
            if state is not None:
                self._close(trial, state, run_id, error, interrupted)

    def _train(self, cfg, trial, resume):
        """The trial's run; a retry carries on from `resume` where its checkpoint fits the
        config (the study may have been rerun with other settings), else starts fresh."""
        from accel.train import train
        from accel.train.checkpoint import CheckpointMismatch

        job = self.job
        kwargs = dict(trial=trial, run_name=record.trial_run_name(trial.number),
                      tags=record.trial_tags(job.study, trial.number, job.invocation),
                      parent_run_id=job.parent_run_id)
        try:
            return train(cfg, resume=resume, **kwargs)
        except CheckpointMismatch as e:  # train() raises it before opening a run, when resuming
            warn(f"trial {trial.number}: run {resume.source_run_id}: {e}: the retry starts "
                 "from epoch 1")
        return train(cfg, **kwargs)

    def _resume_point(self, trial, dest: Path):
        """A trial retried after its worker died carries on from the last checkpoint of the
        newest attempt before it that left one (accel.train.checkpoint)."""
        import optuna
        from optuna.storages import RetryFailedTrialCallback

        from accel.train.checkpoint import download

        frozen = next(t for t in trial.study.get_trials(deepcopy=False)
                      if t.number == trial.number)
        with warnings.catch_warnings():  # Optuna 5 calls the retry API experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            attempts = RetryFailedTrialCallback.retry_history(frozen)
        for number in reversed(attempts):
            run_id = record.find_trial_run(self.tracker, self.job.study, number)
            if run_id is None:
                continue
            resume, notes = download(self.tracker, run_id, dest)
            for line in notes:
                warn(f"trial {trial.number}: {line}")
            if resume is not None:
                note(f"trial {trial.number} retries trial {number}: carries on after epoch "
                     f"{resume.epoch} of run {run_id}")
                resume.same_run = False
                return resume
        return None

    def _close(self, trial, state, run_id, error, interrupted) -> None:
        lease.confirm()  # a trial failed meanwhile as stale: its record stays as that left it
        message = describe_error(error) if error else None
        if interrupted and not message:
            message = (f"stopped by {signals.stopped_by()}: queued again, to carry on from its "
                       f"checkpoint (up to {MAX_RETRY} retries)")
        try:  # never hide the trial's own outcome (a stop, an error) behind a store's error
            if message:
                trial.set_user_attr(record.ATTR_ERROR, message[:record.MAX_TAG_CHARS])
            if interrupted:  # queued again once it is FAIL; a later close ends its run KILLED
                trial.set_user_attr(record.ATTR_STOPPED, True)
        except Exception as e:  # the next invocation queues and closes what is missing
            warn(f"trial {trial.number}: could not record how it ended: {one_line(e)}")
        try:
            run_id = record.close_trial_run(self.tracker, self.job.study, trial.number, state,
                                        message, run_id=run_id, interrupted=interrupted,
                                        open_run=lambda: self._open_run(trial.number))
            trial.set_user_attr(record.ATTR_RUN, run_id)
        except Exception as e:  # never hide the trial's own outcome behind a logging error
            warn(f"trial {trial.number}: could not update its MLflow run: {one_line(e)}")

    def _open_run(self, number: int) -> str:
        """The run of a trial that failed before `train()` opened one (bad value, data error)."""
        job = self.job
        run_id = retry_locked(self.tracker.start_run, job.study, record.trial_run_name(number),
                              tags=record.trial_tags(job.study, number, job.invocation),
                              parent_run_id=job.parent_run_id)
        retry_locked(self.tracker.log_config, run_id, job.cfg)
        return run_id


def objective_values(result, pairs: list[tuple[str, str]]) -> list[float]:
    """Validation metrics from the best epoch (the epoch whose weights the run's best.pt
    holds), costs over the whole run."""
    values = []
    for metric, _ in pairs:
        value = result.costs[metric] if metric in COST_METRICS else result.best[metric]
        if not math.isfinite(value):
            raise RuntimeError(f"{metric} is {value}")
        values.append(value)
    return values


def _free_accelerator_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
