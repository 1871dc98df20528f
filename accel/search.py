"""Optuna tuning studies: the search space from the config, sampler, pruner, storage, objective,
worker processes, and the `accel tune` / `accel best` commands.

A study lives in two stores. Optuna's storage (a journal file, SQLite or PostgreSQL) holds trials,
params and values; MLflow holds one experiment named after the study, with one parent run for the
study and one child run per trial (each a `train()` run). What defines a study (metric, direction,
space) is kept in its user attrs: the same `--study` again resumes it, and a rerun that would change
its meaning is refused.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import os
import re
import shlex
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accel import study_tracking as st
from accel.config import Config, ConfigError, set_key, validate

SPACE_TYPES = ("float", "int", "categorical")
SPEC_FIELDS = ("type", "low", "high", "log", "step", "choices")
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "hyperband", "none")
METRICS = ("val_accuracy", "val_loss", "val_f1")  # what the evaluator reports after every epoch
UNSEARCHABLE = ("search.", "tracking.")  # these define the study and where it is logged
DEFAULT_STORAGE = "mlruns/optuna.journal"
RDB_SCHEMES = ("sqlite", "postgresql", "mysql")
# RDB storages: a RUNNING trial whose worker sent no heartbeat for GRACE_S seconds is stale (the
# worker died); it is marked FAIL and its params are queued again, at most MAX_RETRY times.
HEARTBEAT_S, GRACE_S, MAX_RETRY = 30, 120, 2
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # safe in MLflow filters and paths
# Study user attrs.
ATTR_DEFINITION = "accel.definition"
ATTR_TRACKING = "accel.tracking_uri"
# Trial user attrs.
ATTR_INVOCATION, ATTR_HOST, ATTR_PID = "accel.invocation", "accel.host", "accel.pid"


# --- the search space --------------------------------------------------------------------------


@dataclass(frozen=True)
class Dim:
    """One searched config key: a float or int range, or a list of choices."""

    key: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        if self.type == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return trial.suggest_int(self.key, self.low, self.high, log=self.log,
                                     step=self.step or 1)
        return trial.suggest_categorical(self.key, list(self.choices))

    def as_dict(self) -> dict[str, Any]:
        """The JSON form kept in the study, compared when a study is resumed."""
        if self.type == "categorical":
            return {"type": "categorical", "choices": list(self.choices)}
        return {"type": self.type, "low": self.low, "high": self.high, "log": self.log,
                "step": self.step}


def check_search(cfg: Config) -> list[Dim]:
    """The `search:` section, checked whole before any trial can start (ConfigError otherwise)."""
    s = cfg.search
    for key, value, allowed in (("metric", s.metric, METRICS), ("sampler", s.sampler, SAMPLERS),
                                ("pruner", s.pruner, PRUNERS)):
        if value not in allowed:
            raise ConfigError(f"search.{key}={value!r} is not one of: {', '.join(allowed)}")
    if s.n_trials < 1:
        raise ConfigError(f"search.n_trials={s.n_trials}: must be >= 1")
    return parse_space(cfg)


def parse_space(cfg: Config) -> list[Dim]:
    space = cfg.search.space
    if not space:
        raise ConfigError("search.space is empty: map config keys to ranges, e.g. "
                          "train.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}")
    return [_parse_dim(cfg, str(key), spec) for key, spec in space.items()]


def _parse_dim(cfg: Config, key: str, spec: Any) -> Dim:
    where = f"search.space.{key}"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping like {{type: float, low: 0.001, "
                          f"high: 0.1}}, got {spec!r}")
    unknown = sorted(set(spec) - set(SPEC_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown field {', '.join(map(str, unknown))}; "
                          f"allowed: {', '.join(SPEC_FIELDS)}")
    if key.startswith(UNSEARCHABLE):
        raise ConfigError(f"{where}: {key.split('.')[0]}.* keys define the study itself and "
                          "cannot be searched")
    kind = spec.get("type")
    if kind not in SPACE_TYPES:
        raise ConfigError(f"{where}.type={kind!r} is not one of: {', '.join(SPACE_TYPES)}")
    dim = _categorical(where, key, spec) if kind == "categorical" else _range(where, key, spec)
    for value in dim.choices if kind == "categorical" else (dim.low, dim.high):
        _check_value(cfg, where, dim, value)
    return dim


def _range(where: str, key: str, spec: dict[str, Any]) -> Dim:
    kind = spec["type"]
    if "choices" in spec:
        raise ConfigError(f"{where}: choices is for type: categorical, not {kind}")
    bounds = []
    for name in ("low", "high"):
        if name not in spec:
            raise ConfigError(f"{where}: {name} is required for type: {kind}")
        bounds.append(_number(f"{where}.{name}", spec[name], kind))
    low, high = bounds
    if low >= high:
        raise ConfigError(f"{where}: low={low} must be < high={high}")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log={log!r}: expected true or false")
    if log and low <= 0:
        raise ConfigError(f"{where}: log: true needs low > 0, got low={low}")
    step = spec.get("step")
    if step is not None:
        step = _number(f"{where}.step", step, kind)
        if step <= 0:
            raise ConfigError(f"{where}.step={step}: must be > 0")
        if log:
            raise ConfigError(f"{where}: step and log: true cannot be combined")
    return Dim(key, kind, low, high, log, step)


def _number(where: str, value: Any, kind: str) -> float | int:
    """A finite number; strings too, because YAML 1.1 reads `1e-4` (no dot) as a string."""
    try:
        if isinstance(value, bool):
            raise ValueError
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}={value!r}: expected a number") from None
    if not math.isfinite(x):
        raise ConfigError(f"{where}={value!r}: must be finite")
    if kind == "int":
        if not x.is_integer():
            raise ConfigError(f"{where}={value!r}: expected an integer for type: int")
        return int(x)
    return x


def _categorical(where: str, key: str, spec: dict[str, Any]) -> Dim:
    ranged = [f for f in ("low", "high", "log", "step") if f in spec]
    if ranged:
        raise ConfigError(f"{where}: {', '.join(ranged)} is for float/int ranges; "
                          "type: categorical takes choices")
    choices = spec.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ConfigError(f"{where}: choices must be a non-empty list, got {choices!r}")
    for c in choices:
        if c is not None and not isinstance(c, bool | int | float | str):
            raise ConfigError(f"{where}: choice {c!r} is not a single value "
                              "(null, a number, a string or true/false)")
    if len({json.dumps(c) for c in choices}) != len(choices):
        raise ConfigError(f"{where}: choices {choices!r} repeat a value")
    return Dim(key, "categorical", choices=tuple(choices))


def _get_key(cfg: Config, key: str) -> Any:
    return functools.reduce(getattr, key.split("."), cfg)


def _check_value(cfg: Config, where: str, dim: Dim, value: Any) -> None:
    """Would the config accept `value` for `dim.key`? Checked on a copy, with the config's rules."""
    trial_cfg = copy.deepcopy(cfg)
    try:
        set_key(trial_cfg, dim.key, value)
        validate(trial_cfg)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    got = _get_key(trial_cfg, dim.key)
    if dim.type != "categorical" and (isinstance(got, bool) or not isinstance(got, int | float)):
        raise ConfigError(f"{where}: {dim.key} is not a number; use type: categorical")
    if dim.type == "float" and isinstance(got, int):
        raise ConfigError(f"{where}: {dim.key} takes integers; use type: int")


def trial_config(cfg: Config, dims: list[Dim], trial) -> Config:
    """The base config with this trial's values set (a copy)."""
    out = copy.deepcopy(cfg)
    for dim in dims:
        set_key(out, dim.key, dim.suggest(trial))
    validate(out)
    return out


def definition(cfg: Config, dims: list[Dim]) -> dict[str, Any]:
    """What makes trials of a study comparable; stored in the study's user attrs."""
    return {"metric": cfg.search.metric, "direction": cfg.search.direction,
            "space": {d.key: d.as_dict() for d in dims}}


def check_same_study(name: str, stored: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Refuse to resume a study with another metric, direction or space: say what differs."""
    diffs = [f"search.{k} is {stored.get(k)}, this run asks for {wanted[k]}"
             for k in ("metric", "direction") if stored.get(k) != wanted[k]]
    old, new = stored.get("space", {}), wanted["space"]
    for key in sorted(old.keys() | new.keys()):
        if key not in new:
            diffs.append(f"search.space.{key} is missing from this run")
        elif key not in old:
            diffs.append(f"search.space.{key} is new in this run")
        elif old[key] != new[key]:
            diffs.append(f"search.space.{key} was {_short(old[key])}, now {_short(new[key])}")
    if diffs:
        raise ConfigError(f"study '{name}' exists with another definition ({'; '.join(diffs)}): "
                          "use a new --study NAME, or the study's settings to resume it")


def _short(spec: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in spec.items() if v not in (None, False)})


# --- sampler, pruner, storage ------------------------------------------------------------------


def build_sampler(name: str, seed: int):
    import optuna

    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # 5 random trials before TPE models the space (the default, 10, would leave a 10-trial study
    # all random). constant_liar (Optuna's default) keeps parallel workers from piling on one spot.
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


def build_pruner(name: str, epochs: int):
    """Pruners judge the search metric reported after each epoch (step = epoch)."""
    import optuna

    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "hyperband":
        # Successive halving from 1 epoch up to the full budget, keeping the best third per rung.
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(epochs, 2),
                                              reduction_factor=3)
    # Stop a trial whose metric at epoch k is worse than the median of earlier trials at epoch k,
    # once 3 trials finished; epoch 1 is not judged (under warm-up it says little).
    return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=2)


def worker_seed(base: int, n_existing: int, worker: int) -> int:
    """Distinct per worker and per resume, so no two sample the same startup trials."""
    import numpy as np

    return int(np.random.SeedSequence([base, n_existing, worker]).generate_state(1)[0])


def is_journal(url: str) -> bool:
    return "://" not in url


def open_storage(url: str, on_stale=None):
    """A journal file (one host, many processes) or an RDB URL (many hosts, heartbeats)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from accel.tracking import redact

    if is_journal(url):
        path = Path(url)
        if path.is_dir():
            raise ConfigError(f"--storage {url}: is a folder; give a journal file path such as "
                              f"{path / 'optuna.journal'}")
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    scheme = url.split("://", 1)[0].split("+", 1)[0]
    if scheme not in RDB_SCHEMES:
        raise ConfigError(f"--storage {redact(url)}: use a journal file path, sqlite:///path.db "
                          "or postgresql://user@host/db")
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    try:
        return optuna.storages.RDBStorage(_with_driver(url), heartbeat_interval=HEARTBEAT_S,
                                          grace_period=GRACE_S,
                                          heartbeat_stale_trial_callback=on_stale)
    except Exception as e:  # unreachable server, unknown database, missing driver
        raise ConfigError(f"cannot open Optuna storage {redact(url)}: {st.one_line(e)}") from None


def _with_driver(url: str) -> str:
    """SQLAlchemy 2.1 reads `postgresql://` as psycopg 3; use psycopg2 where only it is there."""
    import importlib.util

    if (url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None
            and importlib.util.find_spec("psycopg2") is not None):
        return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


@dataclass
class RetryStaleTrial:
    """Heartbeat callback: a trial whose worker died is failed in MLflow too and queued again."""

    tracking_uri: str

    def __call__(self, study, trial) -> None:
        import warnings

        from optuna.exceptions import ExperimentalWarning
        from optuna.storages import RetryHeartbeatStaleTrialCallback

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)(study, trial)
        st.close_trial_run(st.tracker_for(self.tracking_uri), study.study_name, trial.number,
                           "FAIL", "worker stopped sending heartbeats; the trial is queued again")


# --- the objective and the worker loop ---------------------------------------------------------


@dataclass
class Plan:
    """Everything a worker process needs for its share of one `accel tune` invocation."""

    cfg: Config  # the base config; trials set the searched keys on a copy
    dims: list[Dim]
    study: str
    storage: str
    tracking_uri: str
    parent_run_id: str
    invocation: str  # tags this invocation's trials and runs, to clean up after Ctrl-C
    seed: int
    workers: int = 1
    deadline: float | None = None  # time.time() after which no new trial starts


class Objective:
    """One trial = one `train()` run of the base config with the trial's values set."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.bad_input: ConfigError | None = None  # stops the invocation: it would recur

    def __call__(self, trial) -> float:
        import optuna

        from accel.train import train

        p = self.plan
        trial.set_user_attr(ATTR_INVOCATION, p.invocation)
        trial.set_user_attr(ATTR_HOST, socket.gethostname())
        trial.set_user_attr(ATTR_PID, os.getpid())
        state, run_id, error, interrupted = "FAIL", None, None, False
        try:
            cfg = trial_config(p.cfg, p.dims, trial)
            result = train(cfg, trial=trial, run_name=f"trial-{trial.number:03d}",
                           tags=st.trial_tags(p.study, trial.number, p.invocation),
                           parent_run_id=p.parent_run_id)
            run_id = result.run_id
            value = result.metrics[p.cfg.search.metric]
            if not math.isfinite(value):
                raise RuntimeError(f"{p.cfg.search.metric} is {value}")
            state = "COMPLETE"
            return value
        except optuna.TrialPruned:
            state = "PRUNED"
            raise
        except ConfigError as e:
            self.bad_input, error = e, e
            raise
        except KeyboardInterrupt:
            interrupted = True
            raise
        except Exception as e:
            error = e
            _free_accelerator_memory()  # after an out-of-memory error the next trial needs it
            raise
        finally:
            self._close(trial, state, run_id, error, interrupted)

    def _close(self, trial, state, run_id, error, interrupted) -> None:
        message = f"{type(error).__name__}: {st.one_line(error)}" if error else None
        if message:
            trial.set_user_attr(st.ATTR_ERROR, message[:500])
        try:
            run_id = st.close_trial_run(self.tracker, self.plan.study, trial.number, state,
                                        message, run_id=run_id, interrupted=interrupted,
                                        open_run=lambda: self._open_run(trial.number))
            trial.set_user_attr(st.ATTR_RUN, run_id)
        except Exception as e:  # never hide the trial's own outcome behind a logging error
            print(f"accel: warning: trial {trial.number}: could not update its MLflow run: "
                  f"{st.one_line(e)}", file=sys.stderr)

    def _open_run(self, number: int) -> str:
        """The run of a trial that failed before `train()` opened one (bad value, data error)."""
        p = self.plan
        run_id = st.retry_locked(self.tracker.start_run, p.study, f"trial-{number:03d}",
                                 tags=st.trial_tags(p.study, number, p.invocation),
                                 parent_run_id=p.parent_run_id)
        st.retry_locked(self.tracker.log_params, run_id, p.cfg.flat())
        return run_id

    @property
    def tracker(self):
        return st.tracker_for(self.plan.tracking_uri)


def _free_accelerator_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Budget:
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


def run_worker(plan: Plan, index: int, budget: Budget) -> None:
    """Claim a trial slot, run one trial, repeat; the study's parent run is updated after each."""
    import optuna

    study = optuna.load_study(
        study_name=plan.study,
        storage=open_storage(plan.storage, on_stale=RetryStaleTrial(plan.tracking_uri)),
        sampler=build_sampler(plan.cfg.search.sampler, worker_seed(plan.seed, 0, index)),
        pruner=build_pruner(plan.cfg.search.pruner, plan.cfg.train.epochs),
    )
    objective = Objective(plan)
    prefix = f"[worker {index}] " if plan.workers > 1 else ""
    last_plots = [time.time() - st.PLOT_EVERY_S / 2]  # the first plots come after a few trials

    def after_trial(study, trial) -> None:
        print(prefix + describe_trial(study, trial, plan.cfg.search.metric), file=sys.stderr)
        plots = time.time() - last_plots[0] >= st.PLOT_EVERY_S
        try:
            st.update_parent(objective.tracker, study, plan.parent_run_id, plots=plots)
            last_plots[0] = time.time() if plots else last_plots[0]
        except Exception as e:
            print(f"accel: warning: could not update the study run: {st.one_line(e)}",
                  file=sys.stderr)

    while budget.claim():
        if plan.deadline is not None and time.time() >= plan.deadline:
            break
        study.optimize(objective, n_trials=1, catch=(Exception,), callbacks=[after_trial],
                       gc_after_trial=True)
        if objective.bad_input is not None:
            raise objective.bad_input


def describe_trial(study, trial, metric: str) -> str:
    took = f" in {trial.duration.total_seconds():.1f}s" if trial.duration else ""
    if trial.state.name == "COMPLETE":
        what = f"{metric}={trial.value:.4f}"
    elif trial.state.name == "PRUNED":
        what = f"at epoch {trial.last_step}" if trial.last_step is not None else ""
    else:
        what = trial.user_attrs.get(st.ATTR_ERROR, "")
    best = st.best_trial(study)
    tail = f"; best {best.value:.4f} (trial {best.number})" if best else ""
    return f"trial {trial.number:03d} {trial.state.name} {what}{took}{tail}"


# --- worker processes, Ctrl-C and clean-up -----------------------------------------------------


def _interrupt_once(signum, frame) -> None:
    """First Ctrl-C: stop (KeyboardInterrupt); later ones are ignored so clean-up can finish."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _worker_main(plan: Plan, index: int, budget: Budget, env: dict[str, str]) -> None:
    """Entry of a spawned worker process; its exit code tells the main process how it ended."""
    os.environ.update(env)  # before torch is imported: which GPU this worker sees
    signal.signal(signal.SIGINT, _interrupt_once)
    quiet_libraries()
    try:
        import torch

        # Share the CPU cores instead of oversubscribing them (n workers x all cores each).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // plan.workers))
        run_worker(plan, index, budget)
    except KeyboardInterrupt:
        sys.exit(130)
    except ConfigError as e:
        print(f"accel: error: {e}", file=sys.stderr)
        sys.exit(2)


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


def run_workers(plan: Plan, n_trials: int) -> int:
    """Run the invocation's trials in this process (1 worker) or in spawned processes."""
    if plan.workers == 1:
        run_worker(plan, 0, Budget(n_trials))
        return 0
    import multiprocessing

    # spawn: CUDA and some BLAS builds cannot be used in a forked child.
    context = multiprocessing.get_context("spawn")
    budget = Budget(n_trials, context)
    procs = [context.Process(target=_worker_main, args=(plan, i, budget, env),
                             name=f"accel-tune-{i}")
             for i, env in enumerate(_gpu_envs(plan.workers, plan.cfg.train.device))]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join()
    except KeyboardInterrupt:
        _stop(procs)
        raise
    codes = [p.exitcode for p in procs]
    if 130 in codes:
        raise KeyboardInterrupt
    if 2 in codes:
        return 2
    return 0 if all(c == 0 for c in codes) else 1


def _stop(procs, wait_s: float = 60.0) -> None:
    """Ctrl-C reached this process: make sure the workers got it, wait, then terminate."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for p in procs:
        if p.is_alive() and p.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGINT)  # a worker ignores a second one
    deadline = time.time() + wait_s
    for p in procs:
        p.join(max(0.1, deadline - time.time()))
        if p.is_alive():
            p.terminate()
            p.join(5)


def clean_up(study, tracker, invocation: str | None) -> int:
    """Mark RUNNING trials FAIL (and their MLflow runs KILLED): those of this invocation after
    Ctrl-C, or, with `invocation=None`, those whose process on this host is gone (a killed run
    on a journal storage, which has no heartbeats). Returns how many were closed."""
    from optuna.trial import TrialState

    closed = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if invocation is not None:
            if t.user_attrs.get(ATTR_INVOCATION) != invocation:
                continue
        elif not _orphaned(t):
            continue
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        try:
            st.close_trial_run(tracker, study.study_name, t.number, "FAIL",
                               "interrupted" if invocation else "its worker process is gone",
                               run_id=t.user_attrs.get(st.ATTR_RUN), interrupted=True)
        except Exception as e:
            print(f"accel: warning: trial {t.number}: {st.one_line(e)}", file=sys.stderr)
        closed += 1
    if invocation is not None:
        for run in st.search_runs(tracker, study.study_name,
                                  f"tags.`accel.invocation` = '{invocation}' AND "
                                  "attributes.status = 'RUNNING'"):
            st.retry_locked(tracker.set_tags, run.info.run_id, {"optuna.trial_state": "FAIL"})
            st.retry_locked(tracker.end_run, run.info.run_id, "KILLED")
    return closed


def _orphaned(trial) -> bool:
    if trial.user_attrs.get(ATTR_HOST) != socket.gethostname():
        return False
    pid = trial.user_attrs.get(ATTR_PID)
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def quiet_libraries() -> None:
    """Optuna logs every trial (failures with tracebacks) and Ignite logs a pruned trial as an
    error; `accel tune` prints one line per trial instead."""
    import logging

    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("ignite").setLevel(logging.CRITICAL)
    for name in ("alembic", "mlflow"):
        logging.getLogger(name).setLevel(logging.WARNING)


# --- the commands ------------------------------------------------------------------------------


def check_study_name(name: str) -> str:
    if not STUDY_NAME.fullmatch(name):
        raise ConfigError(f"--study {name!r}: use letters, digits, '.', '_' and '-' "
                          "(starting with a letter or digit)")
    return name


def open_study(cfg: Config, dims: list[Dim], name: str, storage):
    """Create the study, or load it and check it is the same study (ConfigError if not)."""
    import optuna

    study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                                direction=cfg.search.direction)
    wanted = definition(cfg, dims)
    stored = study.user_attrs.get(ATTR_DEFINITION)
    if stored is None:  # new, or made outside accel: it takes this definition
        stored = {**wanted, "direction": study.direction.name.lower()}
        check_same_study(name, stored, wanted)
        study.set_user_attr(ATTR_DEFINITION, wanted)
    check_same_study(name, stored, wanted)
    return study


def prepare(cfg: Config, study_name: str, storage_url: str | None = None,
            tracking_uri: str | None = None):
    """Study and parent run, made once in the main process before any worker starts.

    Bad input fails first and cheaply (space, storage URL, conflicting study, model name), before
    the MLflow store is touched. Returns (optuna study, Plan); the MLflow store and experiment
    exist afterwards, so worker processes never race to create them."""
    from accel.tracking import Tracker, redact, resolve_uri

    check_study_name(study_name)
    dims = check_search(cfg)
    cfg = copy.deepcopy(cfg)
    if tracking_uri:
        cfg.tracking.uri = tracking_uri
    cfg.tracking.experiment = study_name  # experiment = study
    uri = resolve_uri(cfg.tracking.uri)
    if redact(uri) != uri:
        # Every trial logs its config as params: a password travels in the environment instead.
        os.environ["MLFLOW_TRACKING_URI"] = uri
        cfg.tracking.uri = None
    storage_url = storage_url or DEFAULT_STORAGE
    study = open_study(cfg, dims, study_name,
                       open_storage(storage_url, on_stale=RetryStaleTrial(uri)))
    _check_model_names(cfg, dims)
    tracker = Tracker(uri)
    parent = st.ensure_parent_run(tracker, study, cfg, storage_url)
    if not study.trials:
        enqueue_baseline(study, cfg, dims)
    if redact(uri) == uri:  # `accel best` finds the runs there; a password is never stored
        study.set_user_attr(ATTR_TRACKING, uri)
    plan = Plan(cfg=cfg, dims=dims, study=study_name, storage=storage_url, tracking_uri=uri,
                parent_run_id=parent, invocation=uuid.uuid4().hex[:12],
                seed=worker_seed(cfg.train.seed, len(study.trials), 0))
    return study, plan


def enqueue_baseline(study, cfg: Config, dims: list[Dim]) -> None:
    """A new study's first trial runs the experiment file's own values (those inside the space),
    so the study's best is never worse than the file it was tuned from."""
    params = {}
    for dim in dims:
        value = _get_key(cfg, dim.key)
        inside = (value in dim.choices if dim.type == "categorical"
                  else isinstance(value, int | float) and dim.low <= value <= dim.high)
        if inside:
            params[dim.key] = value
    if params:
        study.enqueue_trial(params, user_attrs={"accel.baseline": True})


def _check_model_names(cfg: Config, dims: list[Dim]) -> None:
    """A misspelt timm model would fail every trial: exit 2 now instead."""
    from accel.models import check_model_name

    names = {cfg.model.name}
    for dim in dims:
        if dim.key == "model.name":
            names = {str(c) for c in dim.choices}
    for name in sorted(names):
        check_model_name(name)


def cli_tune(args, cfg: Config) -> int:
    from accel.tracking import redact

    n_trials = args.n_trials if args.n_trials is not None else cfg.search.n_trials
    if n_trials < 1:
        raise ConfigError(f"--n-trials {n_trials}: must be >= 1")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be >= 1")
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError(f"--timeout {args.timeout}: must be > 0 seconds")
    quiet_libraries()
    study, plan = prepare(cfg, args.study or cfg.name, args.storage, args.tracking_uri)
    plan.workers = args.workers
    plan.deadline = time.time() + args.timeout if args.timeout else None
    tracker = st.tracker_for(plan.tracking_uri)
    orphans = clean_up(study, tracker, None) if is_journal(plan.storage) else 0
    before = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
    print(f"study {plan.study}: {n_trials} trial(s) on {plan.workers} worker(s); "
          f"{before} finished so far{f', {orphans} orphaned marked FAIL' if orphans else ''}; "
          f"storage {redact(plan.storage)}; MLflow {redact(plan.tracking_uri)} "
          f"(experiment {plan.study}, parent run {plan.parent_run_id})", file=sys.stderr)
    previous = signal.signal(signal.SIGINT, _interrupt_once)
    status, code = "FAILED", 1
    try:
        code = run_workers(plan, n_trials)
        status = "FINISHED" if code == 0 else "FAILED"
    except KeyboardInterrupt:
        status, code = "KILLED", 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the clean-up finish
        clean_up(study, tracker, plan.invocation)
        _finish_parent(tracker, study, plan, status)
        signal.signal(signal.SIGINT, previous)
    print(summary(study, plan), file=sys.stderr)
    if status == "KILLED":
        print("accel: interrupted; this run's unfinished trial(s) were marked FAIL (MLflow "
              "KILLED); run the same command again to resume the study", file=sys.stderr)
    elif code == 0 and not _any_complete(study, plan.invocation):
        code = 1  # every trial of this invocation failed: say so to scripts
    return code


def _finish_parent(tracker, study, plan: Plan, status: str) -> None:
    try:
        st.update_parent(tracker, study, plan.parent_run_id, plots=True)
    finally:
        st.retry_locked(tracker.end_run, plan.parent_run_id, status)


def _any_complete(study, invocation: str) -> bool:
    return any(t.user_attrs.get(ATTR_INVOCATION) == invocation
               for t in study.get_trials(deepcopy=False, states=st.complete_states()))


def summary(study, plan: Plan) -> str:
    mine = [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(ATTR_INVOCATION) == plan.invocation]
    counts = {s: sum(t.state.name == s for t in mine) for s in ("COMPLETE", "PRUNED", "FAIL")}
    best = st.best_trial(study)
    best_text = (f"best {plan.cfg.search.metric}={best.value:.4f} (trial {best.number})"
                 if best else "no complete trial yet")
    return (f"study {plan.study}: this run {len(mine)} trial(s) ({counts['COMPLETE']} complete, "
            f"{counts['PRUNED']} pruned, {counts['FAIL']} failed); {len(study.trials)} in all; "
            f"{best_text}. See `accel best --study {plan.study}"
            f"{_storage_flag(plan.storage)}`")


def _storage_flag(storage: str) -> str:
    from accel.tracking import redact

    return "" if storage == DEFAULT_STORAGE else f" --storage {shlex.quote(redact(storage))}"


def cli_best(args) -> int:
    import optuna

    from accel.tracking import DEFAULT_URI, redact, resolve_uri

    name = check_study_name(args.study)
    storage_url = args.storage or DEFAULT_STORAGE
    if is_journal(storage_url) and not Path(storage_url).is_file():
        raise ConfigError(f"no Optuna storage at {storage_url}: run `accel tune` first, or "
                          "pass --storage")
    quiet_libraries()
    storage = open_storage(storage_url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = sorted(optuna.get_all_study_names(storage=storage))
        raise ConfigError(f"no study '{name}' in {redact(storage_url)}; studies there: "
                          f"{', '.join(names) or 'none'}") from None
    best = st.best_trial(study)
    states = [t.state.name for t in study.trials]
    counts = ", ".join(f"{states.count(s)} {word}" for s, word in
                       (("COMPLETE", "complete"), ("PRUNED", "pruned"), ("FAIL", "failed")))
    if best is None:
        print(f"study {name}: no complete trial yet ({len(states)} trials: {counts})",
              file=sys.stderr)
        return 1
    uri = args.tracking_uri or study.user_attrs.get(ATTR_TRACKING) or resolve_uri(None)
    run_id = (best.user_attrs.get(st.ATTR_RUN)
              or st.find_trial_run(st.tracker_for(uri), name, best.number))
    metric = study.user_attrs.get(ATTR_DEFINITION, {}).get("metric", "value")
    command = f"accel reproduce {run_id}"
    if uri != DEFAULT_URI:
        command += f" --tracking-uri {shlex.quote(redact(uri))}"
    lines = [f"study: {name} ({len(states)} trials: {counts})",
             f"best trial: {best.number}",
             f"{metric}: {best.value:.6g}",
             "params:"]
    lines += [f"  {k}: {_show(v)}" for k, v in best.params.items()]
    lines += [f"mlflow run: {run_id} (experiment {name}, {redact(uri)})",
              f"reproduce: {command}"]
    print("\n".join(lines))
    return 0


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
