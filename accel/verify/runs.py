"""What a verification reruns and where it logs: the study's top trials and its baseline, each
rerun with the same fresh seeds, one MLflow run per (trial, seed) under one verification run.

A rerun that finished is found again by its tags and reused, so the same command twice trains
only what is missing. Reruns run in this process, or in `--workers` spawned processes that take
them from one queue.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass

from accel.config import Config
from accel.console import note, progress
from accel.reproduce import point_at
from accel.signals import handle_stops
from accel.tracking import retry_locked, tracker_for
from accel.tune import study_record as record
from accel.tune.objective import objective_values
from accel.tune.pareto import front, is_multi
from accel.tune.workers import stop_processes

ROLE = record.VERIFY_ROLE
RERUN_ROLE = "verify-rerun"
TAG_RUN = "accel.verify.run"  # on a rerun: its verification run
TAG_TRIAL = "accel.verify.trial"
TAG_SEED = "accel.verify.seed"
ATTR_BASELINE = "accel.baseline"  # user attr of the trial that ran the file's own values


@dataclass
class Candidate:
    """A trial to rerun: its number, its tuning values (one per objective) and the config its
    run logged."""

    number: int
    run_id: str
    values: list[float]
    baseline: bool
    config: Config


@dataclass
class Rerun:
    number: int
    seed: int
    values: list[float]  # one per objective
    run_id: str


def metric_key(name: str) -> str:
    """The metric a rerun logs its objective value under (the best epoch's, or the run's cost,
    as the study counted it)."""
    return f"verify_{name}"


def ranked(study) -> list:
    """COMPLETE trials of this study (not copies of another study's), best first."""
    from optuna.study import StudyDirection

    trials = study.get_trials(deepcopy=False, states=record.complete_states())
    maximize = study.direction == StudyDirection.MAXIMIZE
    return sorted(trials, key=lambda t: (-t.value if maximize else t.value, t.number))


def choose(study, top: int) -> list:
    """The top `top` trials (a multi-objective study: its Pareto front), then the baseline
    trial when it is not among them."""
    trials = ranked(study) if not is_multi(study) else sorted(
        study.get_trials(deepcopy=False, states=record.complete_states()), key=lambda t: t.number)
    trials = [t for t in trials if record.ATTR_COPIED not in t.user_attrs]
    chosen = trials[:top] if not is_multi(study) else [
        t for t in front(study) if record.ATTR_COPIED not in t.user_attrs]
    baseline = next((t for t in trials if t.user_attrs.get(ATTR_BASELINE)), None)
    if baseline is not None and baseline not in chosen:
        chosen.append(baseline)
    return chosen


def fresh_seeds(candidates: list[Candidate], n: int) -> list[int]:
    """`n` seeds none of the trials ran with (the seed that won is not reused), the same for
    every trial: seed i pairs the trials' reruns."""
    used = {c.config.train.seed for c in candidates}
    seeds, s = [], 1
    while len(seeds) < n:
        if s not in used:
            seeds.append(s)
        s += 1
    return seeds


def verification_run(tracker, study: str, study_run: str | None, params: dict) -> str:
    """The study's verification run: the latest one again (RUNNING while it works), or new."""
    runs = record.search_runs(tracker, study, f"tags.`accel.role` = '{ROLE}'")
    if runs:
        run_id = runs[-1].info.run_id
        retry_locked(tracker.client.update_run, run_id, status="RUNNING")
    else:
        run_id = retry_locked(tracker.start_run, study, f"verify-{study}", tags={
            "accel.role": ROLE, "accel.study": study, "accel.study_run": study_run or ""})
    retry_locked(tracker.set_tags, run_id, {f"accel.verify.{k}": v for k, v in params.items()})
    return run_id


def finished_reruns(tracker, study: str, run_id: str,
                    names: list[str]) -> dict[tuple[int, int], Rerun]:
    """The reruns of this verification that finished: (trial, seed) -> Rerun."""
    runs = record.search_runs(tracker, study, f"tags.`{TAG_RUN}` = '{run_id}' AND "
                                          "attributes.status = 'FINISHED'")
    done = {}
    for r in runs:
        values = [r.data.metrics.get(metric_key(name)) for name in names]
        if None not in values:
            key = (int(r.data.tags[TAG_TRIAL]), int(r.data.tags[TAG_SEED]))
            done[key] = Rerun(*key, values, r.info.run_id)
    return done


@dataclass
class Job:
    """One rerun: picklable, for a spawned worker."""

    candidate: Candidate
    seed: int
    study: str
    verify_run: str
    objectives: list[tuple[str, str]]  # (metric, direction), as the study counts them
    uri: str


def run_one(job: Job) -> Rerun:
    """Train the trial's logged config with a fresh seed, as a child of the verification run."""
    from accel.train import train  # torch: loaded when a rerun trains, not at import

    c = job.candidate
    cfg = copy.deepcopy(c.config)
    cfg.train.seed = job.seed  # also reseeds the train/val split and the loader order
    point_at(cfg, job.uri, job.study)
    result = train(cfg, run_name=f"verify-trial{c.number}-seed{job.seed}",
                   parent_run_id=job.verify_run,
                   tags={"accel.role": RERUN_ROLE, "accel.study": job.study, TAG_RUN:
                         job.verify_run, TAG_TRIAL: str(c.number), TAG_SEED: str(job.seed),
                         "accel.reproduces": c.run_id})
    values = objective_values(result, job.objectives)
    retry_locked(tracker_for(job.uri).log_metrics, result.run_id, {
        metric_key(name): v for (name, _), v in zip(job.objectives, values, strict=True)}, 0)
    return Rerun(c.number, job.seed, values, result.run_id)


def rerun_line(job: Job, done: Rerun) -> str:
    """The line a finished rerun prints: its trial, its seed and its values."""
    shown = " ".join(f"{name}={v:.4g}" for (name, _), v in zip(job.objectives, done.values,
                                                               strict=True))
    return f"trial {done.number} seed {done.seed}: {shown}"


def run_jobs(jobs: list[Job], workers: int) -> None:
    """Every job, here (1 worker) or in spawned worker processes fed by one queue."""
    if workers == 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs, start=1):
            note(f"rerun {i}/{len(jobs)}: trial {job.candidate.number}, train.seed={job.seed}")
            progress(rerun_line(job, run_one(job)))
        return
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # CUDA and some BLAS cannot fork
    queue = context.Queue()
    for job in jobs:
        queue.put(job)
    n = min(workers, len(jobs))
    for _ in range(n):
        queue.put(None)
    procs = [context.Process(target=_worker_main, args=(queue, n), name=f"accel-verify-{i}")
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join()
    except KeyboardInterrupt:
        stop_processes(procs)
        raise
    codes = [p.exitcode for p in procs]
    if 130 in codes:
        raise KeyboardInterrupt
    if any(c != 0 for c in codes):
        raise RuntimeError(f"a verification worker failed (exit codes {codes})")


def _worker_main(queue, workers: int) -> None:
    handle_stops()  # a Ctrl-C or SIGTERM to the process group ends its rerun KILLED
    try:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
        while (job := queue.get()) is not None:
            progress(rerun_line(job, run_one(job)))
    except KeyboardInterrupt:
        sys.exit(130)


def close_running(tracker, study: str, run_id: str) -> None:
    """Reruns of this verification left RUNNING (a worker killed outright) end KILLED."""
    for r in record.search_runs(tracker, study, f"tags.`{TAG_RUN}` = '{run_id}' AND "
                                            "attributes.status = 'RUNNING'"):
        retry_locked(tracker.end_run, r.info.run_id, "KILLED")
