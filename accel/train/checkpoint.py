"""The last-epoch checkpoint: all a run needs to carry on after its last completed epoch.

It holds the weights (and their moving average or Lookahead average), the optimizer, scheduler
and GradScaler states, the trainer's position and the train loader's (which shuffle, how far
into it: accel.train.loader), the epochs' metrics and every random state (Python, NumPy, torch,
CUDA), taken after the epoch's evaluation, the last thing an epoch does that draws randomness.
Restored into a freshly built run, training goes on exactly as if it had never stopped (bitwise
on CPU with `data.num_workers=0`; loader workers keep their own random streams, which
restart).

In MLflow it lives in two artifact slots, `checkpoint/last-a.pt` (odd epochs) and
`checkpoint/last-b.pt` (even epochs): a process killed while one slot is written leaves the other,
one epoch older, loadable. A run that ends FINISHED or pruned drops both (it is not resumed).
On disk each file is written to a temporary name and renamed.
Checkpoints are read with `torch.load(weights_only=True)`: one holding pickled Python objects is
refused, never executed.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from accel.errors import ConfigError, one_line
from accel.train.random_state import random_states, set_random_states

if TYPE_CHECKING:
    from accel.train.view import RunView

ARTIFACT_DIR = "checkpoint"
SLOTS = ("last-b.pt", "last-a.pt")  # indexed by epoch % 2: epoch 1 -> last-a.pt
BEST = "best.pt"
FORMAT = 1


@dataclass
class Resume:
    """Where a run carries on from: a checkpoint, and the run it continues."""

    state: dict[str, Any]
    source_run_id: str  # the run whose checkpoint this is
    same_run: bool  # True: `accel resume` goes on in that run; False: a new run (retried trial)
    best_weights: Path | None = None  # the source run's checkpoint/best.pt, downloaded

    @property
    def epoch(self) -> int:
        return int(self.state["epoch"])


def slot(epoch: int) -> str:
    return SLOTS[epoch % 2]


# --- capture and restore ----------------------------------------------------------------------


def capture(run: RunView) -> dict[str, Any]:
    """The state at the end of the trainer's current epoch."""
    step, trainer = run.step, run.trainer
    return {
        "format": FORMAT,
        "epoch": trainer.state.epoch,
        "model": run.bare.state_dict(),
        "averaged": run.averaged.state_dict() if run.averaged is not None else None,
        "lookahead": run.lookahead.state_dict() if run.lookahead is not None else None,
        "optimizer": step.optimizer.state_dict(),
        "scheduler": step.scheduler.state_dict() if step.scheduler is not None else None,
        "scaler": step.scaler.state_dict() if step.scaler is not None else None,
        "trainer": dict(trainer.state_dict()),
        "updates": step.updates,
        "history": [dict(row) for row in run.history],
        "batches": run.batches.state_dict(),
        "rng": random_states(),
        # several ranks (train.nproc_per_node): each one's states, gathered where every rank
        # takes them (accel.train.epochs), rank 0's again among them
        "rng_ranks": run.rank_random_states or [],
    }


class CheckpointMismatch(ConfigError):
    """A checkpoint of another config than the run it is restored into (other epochs, another
    model): a retried trial starts fresh instead, `accel resume` refuses."""


def restore(run: RunView, state: dict[str, Any]) -> None:
    """Put `state` (from `capture`) into a freshly built run of the same config."""
    saved = state["trainer"]
    # a budgeted run's epochs are its plan's, which its scheduler state carries on
    epochs = saved["max_epochs"] if run.cfg.train.budget_s else run.cfg.train.epochs
    if (saved["epoch_length"], saved["max_epochs"]) != (run.epoch_length, epochs):
        raise CheckpointMismatch(
            f"the checkpoint is of a run with {saved['max_epochs']} epochs of "
            f"{saved['epoch_length']} batches, this config has {run.cfg.train.epochs} of "
            f"{run.epoch_length}")
    step = run.step
    try:
        run.bare.load_state_dict(state["model"])
        if run.averaged is not None:
            run.averaged.load_state_dict(state["averaged"])
        if run.lookahead is not None:
            run.lookahead.load_state_dict(state["lookahead"])
        step.optimizer.load_state_dict(state["optimizer"])
        if step.scheduler is not None:
            step.scheduler.load_state_dict(state["scheduler"])
        if step.scaler is not None and state["scaler"] is not None:
            step.scaler.load_state_dict(state["scaler"])
    # other shapes, layers, param groups; no moving average or Lookahead where the config
    # has one
    except (RuntimeError, KeyError, ValueError, AttributeError) as e:
        raise CheckpointMismatch("the checkpoint's model or optimizer does not fit this config: "
                                 f"{one_line(e)[:200]}") from None
    run.trainer.load_state_dict(saved)
    step.updates = state["updates"]
    run.history[:] = state["history"]
    run.batches.load_state_dict(state["batches"])
    from accel.ranks import rank

    per_rank = state.get("rng_ranks") or []  # several ranks: each its own
    set_random_states(per_rank[rank()] if rank() < len(per_rank) else state["rng"])


# --- files ------------------------------------------------------------------------------------


def save(obj: Any, path: Path) -> None:
    """`torch.save` to a temporary name, flushed to disk, then renamed over `path`: a crash
    mid-write leaves the previous file whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class UnreadableCheckpoint(Exception):
    """A truncated or damaged checkpoint file (a write that was cut short)."""


def load(path: Path) -> dict[str, Any]:
    """A checkpoint, tensors and plain containers only (`weights_only=True`). A file that is not
    one (cut short, overwritten, random bytes) is `UnreadableCheckpoint`: the other slot may
    still serve. A whole `torch.save` file that holds pickled objects is refused outright."""
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; its index comes last
        raise UnreadableCheckpoint(f"{path.name}: not a torch.save archive (cut short or "
                                   "overwritten)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ConfigError(f"checkpoint {path} holds pickled Python objects, not only tensors: "
                          f"refused (torch.load weights_only=True): {one_line(e)[:200]}") from None
    except Exception as e:  # a damaged archive fails in many ways (KeyError, RuntimeError, ...)
        raise UnreadableCheckpoint(f"{path.name}: {one_line(e)[:200]}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UnreadableCheckpoint(f"{path.name}: not an accel checkpoint of format {FORMAT}")
    return state


# --- in MLflow --------------------------------------------------------------------------------


def upload(tracker, run_id: str, state: dict[str, Any], scratch: Path) -> None:
    """Write `state` into its slot of the run's artifacts."""
    path = scratch / slot(state["epoch"])
    save(state, path)
    try:
        tracker.log_artifact(run_id, path, ARTIFACT_DIR)
    finally:
        path.unlink(missing_ok=True)


def drop(tracker, run_id: str) -> None:
    """Remove the run's two slots: a run that finished (or was pruned) is not resumed, and
    each slot weighs the weights plus the optimizer state. best.pt stays."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    from accel.outage import ride_out
    from accel.tracking.client import store_name
    from accel.uris import with_driver

    run = tracker.client.get_run(run_id)
    # Through the run's own store: an `mlflow-artifacts:` URI names no server, and MLflow would
    # otherwise resolve it through the process's global tracking URI.
    repo = get_artifact_repository(run.info.artifact_uri, tracking_uri=with_driver(tracker.uri))
    names = {Path(f.path).name for f in tracker.client.list_artifacts(run_id, ARTIFACT_DIR)}
    for name in sorted(set(SLOTS) & names):
        ride_out(lambda name=name: repo.delete_artifacts(f"{ARTIFACT_DIR}/{name}"),
                 key=tracker.uri, store=store_name(tracker.uri))


def download(tracker, run_id: str, dest: Path, *, best: bool = True) -> tuple[Resume | None,
                                                                             list[str]]:
    """The newest loadable slot of `run_id` (and its best.pt), with notes on slots that were
    damaged. None when the run has no checkpoint."""
    names = {Path(f.path).name for f in tracker.client.list_artifacts(run_id, ARTIFACT_DIR)}
    newest, notes = None, []
    for name in sorted(set(SLOTS) & names):
        path = Path(tracker.client.download_artifacts(run_id, f"{ARTIFACT_DIR}/{name}", str(dest)))
        try:
            state = load(path)
        except UnreadableCheckpoint as e:
            notes.append(f"run {run_id}: {ARTIFACT_DIR}/{e} (cut short?): skipped")
            continue
        finally:
            path.unlink(missing_ok=True)
        if newest is None or state["epoch"] > newest["epoch"]:
            newest = state
    if newest is None:
        return None, notes
    weights = None
    if best and BEST in names:
        weights = Path(tracker.client.download_artifacts(run_id, f"{ARTIFACT_DIR}/{BEST}",
                                                         str(dest)))
    return Resume(newest, run_id, same_run=True, best_weights=weights), notes
