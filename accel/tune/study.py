"""A study in Optuna's storage and MLflow: its name, sampler and pruner, and `prepare`, which
makes the study and its parent run once, before any worker starts.

What defines a study (metric, direction, space) is kept in its user attrs: the same `--study`
again resumes it, and a rerun that would change its meaning is refused.
"""

from __future__ import annotations

import copy
import os
import re
import socket
import time
import uuid
import warnings
from dataclasses import dataclass

from accel.config import Config, ConfigError, objectives
from accel.console import note
from accel.signals import stop_requested
from accel.tracking import Tracker
from accel.tracking.store import check_reachable
from accel.tune import study_record as record
from accel.tune import warm
from accel.tune.nodes import process_alive, write_lease
from accel.tune.space import Dim, check_same_study, check_search, definition, get_key
from accel.tune.storage import RetryStaleTrial, default_storage, open_storage
from accel.uris import redact, resolve_uri

STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # safe in MLflow filters and paths
# Study user attrs.
ATTR_DEFINITION = "accel.definition"
ATTR_TRACKING = "accel.tracking_uri"
ATTR_CREATOR = "accel.created_by"  # host and pid of the process that created the study
# A node that loads a study another node is creating waits this long for it to be set up.
SETUP_WAIT_S = 60.0


def build_sampler(name: str, seed: int):
    import optuna

    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        # Generations of 8 (Optuna's default, 50, would leave a study of tens of trials random).
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=8)
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


@dataclass
class TuneJob:
    """One `accel tune` invocation: everything a worker process needs for its share of it."""

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


def check_study_name(name: str) -> str:
    if not STUDY_NAME.fullmatch(name):
        raise ConfigError(f"--study {name!r}: use letters, digits, '.', '_' and '-' "
                          "(starting with a letter or digit)")
    return name


def open_study(cfg: Config, dims: list[Dim], name: str, storage):
    """Create the study, or load it and check it is the same study (ConfigError if not).

    Returns (study, set_up): whether this process sets the study up (first trials and
    definition: see `prepare`). The process that created it does; one that loads a study being
    set up by another node waits until the definition, written last, is there. A study with no
    definition and no trial (made outside accel, or its creator died while setting it up) is
    adopted: this process sets it up as its creator would have."""
    import optuna

    wanted_objectives = objectives(cfg.search)
    try:
        study = optuna.create_study(study_name=name, storage=storage,
                                    directions=[d for _, d in wanted_objectives])
        study.set_user_attr(ATTR_CREATOR, {"host": socket.gethostname(), "pid": os.getpid()})
        with warnings.catch_warnings():  # "experimental" in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([m for m, _ in wanted_objectives])  # not "Objective 0"
        return study, True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage)
    wanted = definition(cfg, dims)
    stored = _wait_for_definition(study)
    if stored is None:  # made outside accel, or its creator died: it takes this definition
        directions = [d.name.lower() for d in study.directions]
        if directions != [d for _, d in wanted_objectives]:
            raise ConfigError(f"study '{name}' exists with directions {directions}, this run "
                              f"asks for {[d for _, d in wanted_objectives]}: use a new --study")
        if not study.trials:
            note(f"study '{name}' has no definition and no trial yet ({_why_alone(study)}): "
                 "this run sets it up")
            return study, True
        study.set_user_attr(ATTR_DEFINITION, wanted)
        stored = wanted
    check_same_study(name, stored, wanted)
    return study, False


def _wait_for_definition(study, timeout_s: float = SETUP_WAIT_S) -> dict | None:
    """The definition, once the study's creator wrote it; None if it does not come within
    `timeout_s`, or at once when the creator's process, on this host, is gone."""
    deadline = time.monotonic() + timeout_s
    while (stored := study.user_attrs.get(ATTR_DEFINITION)) is None:
        if time.monotonic() >= deadline or _creator_gone(study):
            return None
        if stop_requested():  # nothing of this process is written yet: stop now
            raise KeyboardInterrupt
        time.sleep(0.5)
    return stored


def _why_alone(study) -> str:
    if _creator_gone(study):
        return f"its creator, process {study.user_attrs[ATTR_CREATOR]['pid']}, is gone"
    return f"none came within {SETUP_WAIT_S:.0f} s"


def _creator_gone(study) -> bool:
    creator = study.user_attrs.get(ATTR_CREATOR) or {}
    pid = creator.get("pid") if isinstance(creator, dict) else None
    return (isinstance(pid, int) and creator.get("host") == socket.gethostname()
            and not process_alive(pid))


def prepare(cfg: Config, study_name: str, storage_url: str | None = None,
            tracking_uri: str | None = None, queued: list[tuple] = (), *, node: bool = False):
    """Study and parent run, made once before any worker (or any other node) runs a trial.

    Bad input fails first and cheaply (space, model name, storage URL, MLflow store, conflicting
    study). The process that creates (or adopts) the study makes the parent run, queues the
    baseline trial and writes the definition, in that order, so other nodes find all three.
    `queued` (run id, values) pairs (`--enqueue`) become the next trials, in a new study before
    the file's `search.enqueue` and its baseline. `node`: this process works on the study (the
    `accel tune` command): its lease (nodes.py) begins before the parent run is reopened, and
    the caller ends it. Returns (optuna study, TuneJob)."""
    check_study_name(study_name)
    dims = check_search(cfg)
    warm.check_file_enqueue(cfg, dims)
    _check_model_names(cfg, dims)
    cfg = copy.deepcopy(cfg)
    if tracking_uri:
        cfg.tracking.uri = tracking_uri
    cfg.tracking.experiment = study_name  # experiment = study
    uri = resolve_uri(cfg.tracking.uri)
    if redact(uri) != uri:
        # Every trial logs its config as params: a password travels in the environment instead.
        os.environ["MLFLOW_TRACKING_URI"] = uri
        cfg.tracking.uri = None
    check_reachable(uri)
    storage_url = storage_url or default_storage()
    study, created = open_study(cfg, dims, study_name,
                                open_storage(storage_url, on_stale=RetryStaleTrial(uri)))
    while cfg.notes:  # what the config adapted to the data, once the study takes it: said by
        note(cfg.notes.pop(0))  # the study, not each trial, and not for a refused definition
    invocation = uuid.uuid4().hex[:12]
    if node:  # live before the parent run is reopened: no other process ends it meanwhile
        write_lease(study, invocation)
    parent = record.ensure_parent_run(Tracker(uri), study, cfg, storage_url)
    if created:
        warm.enqueue_runs(study, queued)  # what the user asked for first, the file's next
        warm.enqueue_file_entries(study, cfg, dims)
        enqueue_baseline(study, cfg, dims)
        study.set_user_attr(ATTR_DEFINITION, definition(cfg, dims))  # last: the study is set up
    else:
        warm.enqueue_runs(study, queued)
    if redact(uri) == uri:  # `accel best` finds the runs there; a password is never stored
        study.set_user_attr(ATTR_TRACKING, uri)
    job = TuneJob(cfg=cfg, dims=dims, study=study_name, storage=storage_url, tracking_uri=uri,
                  parent_run_id=parent, invocation=invocation,
                  seed=worker_seed(cfg.train.seed, len(study.trials), 0))
    return study, job


def enqueue_baseline(study, cfg: Config, dims: list[Dim]) -> None:
    """A new study's first trial runs the experiment file's own values (those inside the space),
    so the study's best is never worse than the file it was tuned from."""
    params = {}
    for dim in dims:
        value = get_key(cfg, dim.key)
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
