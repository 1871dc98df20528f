"""The run's MLflow side: open it (or reopen it, to resume), log each epoch, keep its checkpoints,
log the results, end it. Without a tracker (`track=False`) every call does nothing."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

import accel.train.checkpoint as checkpoint
from accel.console import warn
from accel.errors import one_line
from accel.tracking import retry_locked
from accel.tracking.lineage import log_splits, split_record
from accel.train.checkpoint import Resume

if TYPE_CHECKING:
    from accel.train.view import RunView


class RunLog:
    """Writes are retried while SQLite says "database is locked" (processes share a store)."""

    def __init__(self, tracker=None, run_id: str | None = None, scratch: Path | None = None,
                 keep_checkpoints: bool = False):
        self.tracker, self.run_id = tracker, run_id
        self.scratch, self.keep_checkpoints = scratch, keep_checkpoints
        self.monitor = None  # MLflow's SystemMetricsMonitor, while the run trains
        self.resumable = False  # a last-epoch checkpoint is in the store (`accel resume`)

    def metrics(self, values: dict[str, float], step: int) -> None:
        if self.tracker:
            retry_locked(self.tracker.log_metrics, self.run_id, values, step=step)

    def peak(self, run: RunView) -> None:
        """The peak MFU is measured against, and how it was found (accel.train.peak); logged
        again where a run outran it and it was measured anew."""
        if self.tracker and run.peak is not None:
            retry_locked(self.tracker.set_tags, self.run_id, {"accel.peak": run.peak.how})
            retry_locked(self.tracker.log_metrics, self.run_id, run.peak.metrics(), step=0)

    def best_weights(self, model: torch.nn.Module) -> None:
        """`checkpoint/best.pt` (a state_dict), logged as soon as an epoch beats the others."""
        if self.tracker and self.keep_checkpoints:
            path = self.scratch / checkpoint.BEST
            checkpoint.save(model.state_dict(), path)
            self.tracker.log_artifact(self.run_id, path, checkpoint.ARTIFACT_DIR)

    def stored_best(self) -> dict[str, torch.Tensor] | None:
        """The run's checkpoint/best.pt from this process's scratch folder or the store."""
        if not (self.tracker and self.keep_checkpoints):
            return None
        best = self.scratch / checkpoint.BEST
        if not best.exists():
            try:
                best = Path(self.tracker.client.download_artifacts(
                    self.run_id, f"{checkpoint.ARTIFACT_DIR}/{checkpoint.BEST}",
                    str(self.scratch)))
            except Exception:
                return None
        return torch.load(best, map_location="cpu", weights_only=True)

    def last_state(self, run: RunView) -> None:
        """The last-epoch checkpoint (`accel resume` carries on from it)."""
        if self.tracker and self.keep_checkpoints:
            checkpoint.upload(self.tracker, self.run_id, checkpoint.capture(run), self.scratch)
            self.resumable = True

    def budget_plan(self, run: RunView) -> None:
        """`budget_plan.json`: a budgeted run's plan and its revisions so far (budget.py)."""
        from accel.train.budget import ARTIFACT, record

        if self.tracker:
            plan = record(run.budget, run.step.updates, len(run.history))
            retry_locked(self.tracker.log_json, self.run_id, plan, ARTIFACT)

    def drop_last_state(self) -> None:
        """A finished or pruned run is not resumed: its last-epoch checkpoint goes (best.pt
        stays). A store that cannot delete only costs space."""
        if self.tracker and self.keep_checkpoints:
            try:
                checkpoint.drop(self.tracker, self.run_id)
            except Exception as e:
                warn(f"run {self.run_id}: its last-epoch checkpoint stays: {one_line(e)}")

    def watch_system(self, resumed: bool) -> None:
        """MLflow's system metrics (`system/...`, every 10 s or
        $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL) while the run trains."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        from accel.uris import with_driver

        self.monitor = SystemMetricsMonitor(self.run_id, resume_logging=resumed,
                                            tracking_uri=with_driver(self.tracker.uri))
        self.monitor.start()

    def log_model(self, run: RunView) -> None:
        """The best epoch's weights (those best.pt holds) as an MLflow PyTorch model in this
        run (`tracking.log_model`)."""
        import copy

        from accel.data import normalisation, to_unit_range
        from accel.engine import unguard_convs
        from accel.tracking.model import log_torch_model, served

        model = copy.deepcopy(run.scored).cpu().eval()
        unguard_convs(model)
        # In memory when the best epoch ran in this process; else best.pt (a resumed run)
        best = run.best_state if run.best_state is not None else self.stored_best()
        if best is not None:
            model.load_state_dict(best)
        data, kind = run.data, run.cfg.data.dataset
        mean, std = normalisation(kind, data.in_chans)
        module, metadata = served(model, data.classes, (data.in_chans, data.img_size,
                                                        data.img_size), mean, std)
        x, _ = next(iter(data.val))  # two images: with one, torch.export fixes the batch at 1
        log_torch_model(self.tracker.uri, self.run_id, module,
                        to_unit_range(x[:2].float().cpu(), kind).numpy(), run.cfg.model.name,
                        metadata)

    def end(self, status: str | None, error: BaseException | None = None) -> None:
        """End the run with `status` (None: leave it as the store has it, for a trial that
        another worker failed meanwhile). While `error` propagates, a failure to reach the
        store is only reported: it must not replace the error that ended the run."""
        if not self.tracker:
            return
        if self.monitor is not None:
            self.monitor.finish()
        if status is None:
            return
        try:
            retry_locked(self.tracker.end_run, self.run_id, status)
        except Exception as e:
            if error is None:
                raise
            warn(f"could not mark run {self.run_id} {status}: {one_line(e)}")


def open_run(run: RunView, run_name: str | None, tags: dict[str, str] | None,
             parent_run_id: str | None, scratch: Path, resume: Resume | None = None) -> RunLog:
    """The MLflow run: the whole config and what it resolved to here, and the environment. A
    resumed run is the same run again (`accel resume`) or a new one that starts with the
    resumed run's epochs (a trial retried after its worker died)."""
    from accel.tracking import Tracker

    cfg = run.cfg
    tracker = Tracker(cfg.tracking.uri)
    keep = cfg.tracking.log_checkpoint
    if resume is not None and resume.same_run:
        log = RunLog(tracker, resume.source_run_id, scratch, keep)
        _guarded(log, _reopen, run, resume)
        if cfg.tracking.system_metrics:
            log.watch_system(resumed=True)
        return log
    run_id = retry_locked(
        tracker.start_run,
        cfg.tracking.experiment or cfg.name,
        run_name or f"train-{cfg.model.name}",
        tags={"accel.role": "train", **(tags or {})},
        parent_run_id=parent_run_id,
    )
    log = RunLog(tracker, run_id, scratch, keep)
    _guarded(log, _log_recipe, run)
    if resume is not None:
        _guarded(log, _carry_over, run, resume)
    if cfg.tracking.system_metrics:
        log.watch_system(resumed=False)
    return log


def _guarded(log: RunLog, fn, *args) -> None:
    """A run that never trained must not stay RUNNING."""
    try:
        fn(log, *args)
    except BaseException as e:
        log.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED", e)
        raise


def _log_recipe(log: RunLog, run: RunView) -> None:
    from accel.tracking import environment

    cfg, tracker = run.cfg, log.tracker
    amp = str(run.amp_dtype).replace("torch.", "") if run.amp_dtype else "off"
    retry_locked(tracker.log_config, log.run_id, cfg, {
        "effective_batch_size": cfg.train.effective_batch_size,
        "resolved.device": str(run.device),
        "resolved.amp": amp,
        "resolved.num_classes": run.data.num_classes,
        "resolved.train_size": len(run.data.train.dataset),
        "resolved.val_size": len(run.data.val.dataset),  # what chance-level noise rests on
        "resolved.img_size": run.data.img_size,
        "resolved.in_chans": run.data.in_chans,
        "resolved.threads": torch.get_num_threads(),  # OpenMP settings: environment.json
        **_speed_params(run),
    })
    env = environment(str(run.device), cfg.train.seed)
    retry_locked(tracker.log_json, log.run_id, env, "environment.json")
    if cfg.train.amp == "auto":  # what it chose here, and the probe's timings
        retry_locked(tracker.set_tags, log.run_id, run.amp.tags())
        if run.amp.metrics():
            retry_locked(tracker.log_metrics, log.run_id, run.amp.metrics(), step=0)
    retry_locked(log_splits, tracker.client, log.run_id, data_records(cfg, run.data))
    log.peak(run)


def _speed_params(run: RunView) -> dict:
    """FLOPs of one training image (accel.flops): the model's and the input's, so a rerun's."""
    return {} if run.flops is None else {"resolved.flops_per_image": run.flops.per_image}


def data_records(cfg, data) -> list[dict]:
    """One lineage record per split the run uses (accel.tracking.lineage)."""
    d = cfg.data
    source = ("sklearn.datasets.load_digits" if d.dataset == "digits"
              else str(Path(d.root).expanduser().resolve()))
    loaders = {"train": data.train, "val": data.val, "test": data.test}
    return [split_record(d.dataset, split, loader.dataset, source, data.classes)
            for split, loader in loaders.items() if loader is not None]


def _reopen(log: RunLog, run: RunView, resume: Resume) -> None:
    """RUNNING again, tagged with the epoch it carries on from; this machine's environment."""
    from accel.tracking import environment

    retry_locked(log.tracker.client.update_run, log.run_id, status="RUNNING")
    retry_locked(log.tracker.set_tags, log.run_id, {"accel.resumed_from_epoch": resume.epoch})
    env = environment(str(run.device), run.cfg.train.seed)
    retry_locked(log.tracker.log_json, log.run_id, env,
                 f"environment-resumed-epoch{resume.epoch}.json")
    logged = retry_locked(log.tracker.client.get_metric_history, log.run_id,
                          run.cfg.search.metric)
    _log_epochs(log, resume, skip={m.step for m in logged})


def _log_epochs(log: RunLog, resume: Resume, skip: set[int]) -> None:
    """The checkpoint's epochs not logged yet (a run stopped between its checkpoint and its
    metrics; or a new run that carries on from another)."""
    for epoch, row in enumerate(resume.state["history"], start=1):
        if epoch not in skip:
            log.metrics(row, step=epoch)


def _carry_over(log: RunLog, run: RunView, resume: Resume) -> None:
    """The new run starts where the old one stopped: its epochs' metrics, best weights and
    checkpoint, and tags naming it."""
    tracker = log.tracker
    retry_locked(tracker.set_tags, log.run_id, {"accel.resumed_from": resume.source_run_id,
                                                 "accel.resumed_from_epoch": resume.epoch})
    _log_epochs(log, resume, skip=set())
    if log.keep_checkpoints:
        if resume.best_weights is not None:
            tracker.log_artifact(log.run_id, resume.best_weights, checkpoint.ARTIFACT_DIR)
        checkpoint.upload(tracker, log.run_id, resume.state, log.scratch)


def log_results(run: RunView, final: dict[str, float], best: int) -> None:
    """test_* metrics, the best epoch and its metric, the figures (tracking.figures): the
    confusion matrix of the last evaluation and the time split (best.pt was logged when its
    epoch ended)."""
    log = run.log
    if "confusion_matrix" not in run.evaluator.state.metrics:  # resumed with no epoch left
        run.evaluator.run(run.data.val)  # on every rank: its metrics are reduced across them
    if log.tracker is None:
        return
    metric = run.cfg.search.metric
    summary = {k: v for k, v in final.items() if k.startswith("test_")}
    summary.update({"best_epoch": best, f"best_{metric}": run.history[best - 1][metric],
                    "train_time_s": run_costs(run.history)["train_time_s"],
                    "train_updates": final["train_updates"], "train_epochs": len(run.history)})
    if run.budget is not None:
        summary["budget_s"] = run.cfg.train.budget_s
        measured = {"update_time_s": run.budget.update_s,
                    "last_update_time_s": run.budget.last_update_s}
        summary.update({k: v for k, v in measured.items() if v is not None})
        log.budget_plan(run)
    log.metrics(summary, step=run.trainer.state.epoch)
    if run.cfg.tracking.figures:
        matrix = run.evaluator.state.metrics["confusion_matrix"]
        log_confusion_matrix(log.tracker, log.run_id, matrix, run.data.classes)
        if run.splits:
            log_time_split(log.tracker, log.run_id, run.splits, len(run.history))
    if run.cfg.tracking.log_model:
        log.log_model(run)


def run_costs(history: list[dict[str, float]]) -> dict[str, float]:
    """What a run cost (config.COST_METRICS): total training seconds (evaluation excluded),
    mean images per second over the steady epochs (the first left out where there are several:
    it pays for compiling and kernel selection), peak memory."""
    if not history:
        return {}
    steady = history[1:] or history
    return {"train_time_s": sum(row["epoch_time_s"] for row in history),
            "train_throughput": sum(row["train_throughput"] for row in steady) / len(steady),
            "peak_memory_mb": max(row["peak_memory_mb"] for row in history)}


def log_confusion_matrix(tracker, run_id: str, matrix: torch.Tensor, classes: list[str]) -> None:
    """confusion_matrix.png: true label by row, prediction by column, counts in the cells (up to
    20 classes). Drawn with matplotlib alone: sklearn's ConfusionMatrixDisplay draws the same,
    but importing sklearn costs more than a second of every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = matrix.cpu().numpy()
    n = len(classes)
    side = max(4.0, 0.45 * n)
    fig, ax = plt.subplots(figsize=(side, side))
    ax.imshow(counts, interpolation="nearest", cmap="viridis")
    if n <= 20:
        middle = (counts.max() + counts.min()) / 2.0
        for (i, j), value in np.ndenumerate(counts):
            ax.text(j, i, f"{int(value)}", ha="center", va="center",
                    color="black" if value > middle else "white")
    ax.set(xticks=range(n), yticks=range(n), xlabel="Predicted label", ylabel="True label")
    ax.set_xticklabels(classes, rotation="vertical")
    ax.set_yticklabels(classes)
    fig.tight_layout()
    tracker.log_figure(run_id, fig, "confusion_matrix.png")
    plt.close(fig)


def log_time_split(tracker, run_id: str, splits: list[dict[str, float]], epochs: int) -> None:
    """time_split.png: each epoch this process trained as a bar of its wall time, stacked by
    where the time went (accel.timing), its MFU above it where the run measured one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from accel.timing import PARTS

    first = epochs - len(splits) + 1  # a resumed run's earlier epochs ran in another process
    x = np.arange(first, epochs + 1)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(x) + 3), 4))
    bottom = np.zeros(len(x))
    for part in PARTS:
        seconds = np.array([max(s[f"time_{part}_s"], 0.0) for s in splits])
        ax.bar(x, seconds, bottom=bottom, label=part)
        bottom += seconds
    for xi, top, split in zip(x, bottom, splits, strict=True):
        if "mfu" in split:
            ax.text(xi, top, f"{split['mfu']:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set(xlabel="epoch", ylabel="seconds", title="Where each epoch's time went (MFU above)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    tracker.log_figure(run_id, fig, "time_split.png")
    plt.close(fig)
