"""One trial, asked and told by accel rather than inside `study.optimize`, so that accel owns
the order of its events:

- a stop signal (Ctrl-C, SIGTERM) is recorded while Optuna asks for the trial, tells its outcome
  or reads the storage, and raised after the tell (a KeyboardInterrupt inside SQLAlchemy's query
  broke Optuna's own clean-up with a traceback); inside the objective it stops the training where
  it is, as before, and each store call there finishes first (accel.outage);
- the trial's heartbeat also watches the trial: a worker frozen past the grace period comes back
  to a trial another worker has failed as stale and queued again; the heartbeat revokes its
  lease (accel.lease), the training stops at its next update, nothing is told or written for it,
  and the worker goes on to the next trial.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import warnings
from collections.abc import Callable

from accel import lease, signals
from accel.console import progress


def run_one_trial(study, objective, after: Callable, prefix: str = ""):
    """Ask, run `objective(trial)`, tell; `after(study, frozen_trial)` once told. Returns the
    finished trial, or None when the trial was lost to a retry. A stop that arrived outside
    the objective is raised after the tell; one inside it, once the trial is told FAIL."""
    import optuna
    from optuna.trial import TrialState

    with signals.deferred_stops():
        heartbeat = _heartbeat_on(study)
        if heartbeat:
            with warnings.catch_warnings():  # "experimental" in Optuna 5
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)
        with warnings.catch_warnings():  # "supposed to be used with Study.optimize": it is not
            warnings.simplefilter("ignore", UserWarning)
            trial = study.ask()
        value, state, stop = None, TrialState.FAIL, None
        with Watch(study, trial) if heartbeat else contextlib.nullcontext():
            try:
                value = objective(trial)  # a stop may end it anywhere (its `live_stops`)
                state = TrialState.COMPLETE
            except optuna.TrialPruned:
                state = TrialState.PRUNED
            except lease.LeaseLost as e:
                progress(f"{prefix}trial {trial.number:03d} left to its retry: {e}")
                return None
            except KeyboardInterrupt as e:
                stop = e
            except Exception:  # the objective recorded it on the trial and its run
                pass
        frozen = study.tell(trial, value if state == TrialState.COMPLETE else None,
                            state=state, skip_if_finished=True)
        if stop is not None:
            raise stop
        if frozen.state != state:
            progress(f"{prefix}trial {trial.number:03d} was failed meanwhile (its heartbeats "
                     "stopped); left to its retry")
        else:
            after(study, frozen)
    gc.collect()  # what the trial's run held, before the next one builds its own
    return frozen


def _heartbeat_on(study) -> bool:
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return is_heartbeat_enabled(study._storage)


class Watch:
    """Optuna's heartbeat (the storage's `record_heartbeat` every interval, in a thread), which
    also holds the trial's lease: it checks that the trial is still RUNNING before each beat,
    and revokes the lease when it is not."""

    def __init__(self, study, trial):
        self.storage, self.trial_id, self.number = study._storage, trial._trial_id, trial.number
        self.interval = self.storage.get_heartbeat_interval()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="accel-heartbeat", daemon=True)

    def gone(self) -> str | None:
        """Why the trial is no longer this worker's, or None while it is."""
        state = self.storage.get_trial(self.trial_id).state
        if state.name == "RUNNING":
            return None
        return (f"it was failed as stale ({state.name}) while this worker sent no heartbeat, "
                "and queued again")

    def _beat(self) -> None:
        while not self.stopped.is_set():
            try:
                why = self.gone()
                if why:
                    lease.revoke(why)
                    return
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # a store away: ride_out said so; the next beat tries again
                pass
            self.stopped.wait(self.interval)

    def __enter__(self):
        lease.hold(self.gone)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()
        lease.release()
        return False
