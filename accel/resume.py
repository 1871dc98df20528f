"""`accel resume RUN_ID`: carry an interrupted run on from its last-epoch checkpoint, in the same
MLflow run (RUNNING again, then FINISHED), logging from the next epoch on.

The config is the one the run logged (`config.yaml`); the checkpoint is the newer loadable one of
`checkpoint/last-a.pt` and `last-b.pt` (accel.train.checkpoint). On CPU with `data.num_workers=0`
the resumed run ends bitwise equal to the same run never interrupted.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from accel.console import note, warn
from accel.errors import ConfigError
from accel.reproduce import load_original
from accel.tracking.store import open_store


def cli_resume(args) -> int:
    from accel.train import Replay, result_line, train
    from accel.train.checkpoint import CheckpointMismatch, download

    run_id = args.run_id
    tracker = open_store(args.tracking_uri)
    original = load_original(tracker, run_id)
    if original.status == "FINISHED":
        raise ConfigError(f"run {run_id} is FINISHED: nothing to resume "
                          f"(`accel reproduce {run_id}` trains it again)")
    refuse_a_trial(tracker, run_id)
    if original.status == "RUNNING":
        warn(f"run {run_id} is marked RUNNING: if its process still runs somewhere, stop it "
             "first (a process killed with SIGKILL leaves its run RUNNING)")
    cfg = original.config
    cfg.tracking.uri = tracker.uri  # the run logged no store URL; it lives in this one
    with tempfile.TemporaryDirectory(prefix="accel-") as tmp:
        resume, notes = download(tracker, run_id, Path(tmp), best=False)
    for line in notes:
        warn(line)
    if resume is None:
        raise ConfigError(
            f"run {run_id} has no last-epoch checkpoint (checkpoint/last-a.pt, last-b.pt): it "
            "stopped before its first epoch ended or ran with tracking.log_checkpoint=false; "
            f"`accel reproduce {run_id}` trains it from the start")
    if original.source != "config.yaml":
        warn(f"run {run_id}: config rebuilt from its params (no config.yaml)")
    planned = (f"{resume.state['trainer']['max_epochs']} planned within train.budget_s="
               f"{cfg.train.budget_s:g}" if cfg.train.budget_s else cfg.train.epochs)
    note(f"resuming run {run_id} after epoch {resume.epoch} of {planned}")
    try:  # in the precision it trained in; a budget's plan goes on from the checkpoint
        result = train(cfg, resume=resume, replay=Replay(amp=original.replay.amp))
    except CheckpointMismatch as e:  # the data or the model's code changed since
        raise ConfigError(f"run {run_id}: {e}; `accel reproduce {run_id}` trains it from the "
                          "start") from None
    print(result_line(result))
    return 0


def refuse_a_trial(tracker, run_id: str) -> None:
    """A study trial's run is carried on by its study (Optuna retries the trial, which resumes
    from the run's checkpoint in a new run): resumed here, the run would end FINISHED while the
    study keeps the trial FAIL, and `accel best` would never see it."""
    tags = tracker.client.get_run(run_id).data.tags
    if tags.get("accel.role") == "trial":
        study = tags.get("accel.study", "?")
        raise ConfigError(
            f"run {run_id} is trial {tags.get('optuna.trial_number', '?')} of study {study}, and "
            "a study retries its own trials from their checkpoints: run "
            f"`accel tune --study {study}` again with the study's config and storage")
