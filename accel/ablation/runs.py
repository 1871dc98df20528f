"""Running an ablation: every combination through the same `train(cfg)`, interleaved repeats,
and, with a tracker, one MLflow parent run (`accel.role=ablation`) with a child per combination
whose repeats are its own children (real `train` runs).

Timing: `train` stops the clock at the end of each epoch after a device synchronisation (so
queued GPU work is counted) and before validation. The first epoch (kernel selection, compile) is
reported apart; the steady-state time is the median of the later epochs. Repeats run interleaved
(all combinations, then all again, in reversed order every other repeat), so machine drift hits
every combination alike; speed-ups are paired by repeat: baseline time / combination time.
"""

from __future__ import annotations

import math
import time

from accel.ablation.plan import (
    AblationPlan,
    Combination,
    combination_config,
    combinations,
    make_plan,
    not_applicable,
    repeat_seed,
    schedule,
)
from accel.ablation.record import RunRecord, record_from_history
from accel.ablation.report import (
    Ablation,
    csv_table,
    describe_plan,
    device_name,
    load_average,
    runs_csv,
    speedup_figure,
    summarize,
)
from accel.config import Config
from accel.console import progress
from accel.errors import ConfigError, describe_error
from accel.signals import deferred_stops


def reset_peak_memory(device) -> None:
    """Each run reports its own peak, not the process's so far.

    CUDA: `train` resets the allocator's counter itself. CPU: `train` reads the process's max
    RSS, which Linux resets to the current RSS when "5" is written to /proc/self/clear_refs,
    after the memory earlier runs freed and the process kept (train.keep_freed_memory) went back.
    """
    if device.type != "cpu":
        return
    from accel.train.memory import release_freed_memory

    release_freed_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux or not allowed: the peak is then the process's running maximum


def run_one(cfg: Config, combo: Combination, repeat: int, *, parent_run_id: str | None,
            track: bool) -> RunRecord:
    """One training run of one combination; a failure is recorded, not raised."""
    from accel.engine import resolve_device
    from accel.train import train

    device = resolve_device(cfg.train.device)
    record = RunRecord(combo.name, repeat, cfg.train.seed)
    if cfg.train.compile != "off":
        import torch

        torch._dynamo.reset()  # a fresh compile per run; the cache allows only 8 recompiles
    reset_peak_memory(device)
    try:
        result = train(cfg, run_name=f"{combo.name} r{repeat + 1}", parent_run_id=parent_run_id,
                       tags={"accel.ablation.combination": combo.name,
                             "accel.ablation.repeat": str(repeat + 1)},
                       track=track)
    except ConfigError:
        raise  # bad input is the same for every combination: stop with exit 2
    except Exception as e:  # a NaN loss, an OOM, a compile error: the table says so
        record.error = describe_error(e)
        if device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        return record
    record.run_id, record.ok = result.run_id, True
    return record_from_history(record, result.history, cfg.train.target, result.splits)


def check_input(cfg: Config, techniques: tuple[str, ...], repeats: int):
    """(device, plan, combinations) once the repeats, the model, the plan and the data are
    known good: bad input is the one-line exit 2, before any MLflow run exists."""
    from accel.engine import resolve_device
    from accel.models import check_model_name

    if repeats < 1:
        raise ConfigError(f"--repeats {repeats}: must be >= 1")
    check_model_name(cfg.model.name)
    device = resolve_device(cfg.train.device)
    plan = make_plan(cfg, techniques, device)
    _check_data(cfg, device)
    return device, plan, combinations(techniques)


def run_ablation(cfg: Config, techniques: tuple[str, ...], repeats: int, *,
                 tracker=None, parent_run_id: str | None = None) -> Ablation:
    """All runs; with a tracker, the parent (`accel.role=ablation`, a child of `parent_run_id`
    in a grid) and its children are logged."""
    device, plan, combos = check_input(cfg, techniques, repeats)
    header = describe_plan(cfg, plan, repeats, device_name(device))
    progress(header)
    experiment = cfg.tracking.experiment or cfg.name

    parent, children, status = None, {}, "FAILED"
    try:
        if tracker is not None:
            with deferred_stops():  # the runs are made whole; a stop then ends them KILLED
                parent = _start_parent(tracker, cfg, plan, repeats, experiment, device,
                                       parent_run_id)
                children = {c.name: _start_child(tracker, c, cfg, plan, experiment, parent)
                            for c in combos if not not_applicable(c, plan)}
        began = time.perf_counter()
        records = _run_all(cfg, plan, schedule(combos, repeats), tracker, experiment, children)
        trained = sum(r.train_s for r in records)
        footer = (f"{len(records)} runs in {time.perf_counter() - began:.0f} s, {trained:.0f} s "
                  "of it training epochs (the rest: set-up, evaluation, test split, logging); "
                  f"load average at end: {load_average()}")
        result = Ablation(plan, summarize(combos, records, plan), records, header, repeats,
                          parent, footer)
        if tracker is not None:
            _log_results(tracker, result, children, cfg)
        status = "FINISHED" if result.baseline_ok else "FAILED"
        return result
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if parent is not None:
            _end_runs(tracker, parent, children, status)


def _check_data(cfg: Config, device) -> None:
    """The data is there and readable (a missing root is the one-line exit 2), before any run
    is made; an in-memory dataset is decoded now, so it is not charged to the baseline."""
    from accel.data import build_data

    build_data(cfg, device).close()


def _run_all(cfg: Config, plan: AblationPlan, order: list[tuple[int, Combination]], tracker,
             experiment: str, children: dict[str, str]) -> list[RunRecord]:
    """The runs in `order`, skipping those that are n/a here, one progress line each."""
    records: list[RunRecord] = []
    todo = [(r, c) for r, c in order if not not_applicable(c, plan)]
    for i, (r, combo) in enumerate(todo, 1):
        run_cfg = combination_config(cfg, combo, plan)
        run_cfg.train.seed = repeat_seed(cfg, r)
        if tracker is not None:
            run_cfg.tracking.uri, run_cfg.tracking.experiment = tracker.uri, experiment
        started = time.perf_counter()
        rec = run_one(run_cfg, combo, r, parent_run_id=children.get(combo.name),
                      track=tracker is not None)
        records.append(rec)
        progress(f"[{i}/{len(todo)}] r{r + 1} (seed {rec.seed}) {combo.name}: " + (
            f"{rec.steady_epoch_s:.2f} s/epoch steady, first {rec.first_epoch_s:.2f} s, "
            f"{rec.throughput:.0f} img/s, val_acc {rec.val_accuracy:.3f}"
            if rec.ok else f"FAILED ({rec.error})")
            + f"  [{time.perf_counter() - started:.0f} s]")
    return records


# --- the MLflow record ----------------------------------------------------------------------


def _start_parent(tracker, cfg: Config, plan: AblationPlan, repeats: int, experiment: str,
                  device, grid_run_id: str | None) -> str:
    from accel.tracking import environment

    name = f"ablation {','.join(plan.techniques)}"
    run_id = tracker.start_run(
        experiment, f"{cfg.name}: {name}" if grid_run_id else name,
        tags={"accel.role": "ablation", "accel.ablation.techniques": ",".join(plan.techniques),
              "accel.ablation.repeats": str(repeats), "accel.device": str(device)},
        parent_run_id=grid_run_id,
    )
    tracker.log_config(run_id, cfg, {
        "ablation.techniques": ",".join(plan.techniques), "ablation.repeats": repeats,
        "ablation.effective_batch_size": plan.effective_batch,
        "ablation.ga_steps": plan.ga_steps, "ablation.amp": plan.amp,
        "ablation.updates_per_epoch": plan.updates_per_epoch,
    })
    tracker.log_json(run_id, environment(str(device), cfg.train.seed), "environment.json")
    return run_id


def _start_child(tracker, combo: Combination, cfg: Config, plan: AblationPlan, experiment: str,
                 parent: str) -> str:
    """One run per combination; its repeats are its own children (real `train` runs)."""
    run_id = tracker.start_run(
        experiment, combo.name, parent_run_id=parent,
        tags={"accel.role": "ablation-combination", "accel.ablation.combination": combo.name},
    )
    resolved = combination_config(cfg, combo, plan)
    params = {f"technique.{t}": ("on" if t in combo.on else "off") for t in plan.techniques}
    params.update({"train.batch_size": resolved.train.batch_size,
                   "train.accumulation_steps": resolved.train.accumulation_steps,
                   "train.epoch_length": resolved.train.epoch_length,
                   "train.amp": resolved.train.amp, "data.pin_memory": resolved.data.pin_memory,
                   "data.on_device": resolved.data.on_device,
                   "train.channels_last": resolved.train.channels_last,
                   "train.compile": resolved.train.compile})
    tracker.log_params(run_id, params)
    return run_id


def _log_results(tracker, result: Ablation, children: dict[str, str], cfg: Config) -> None:
    parent_metrics = {}
    skipped = [row.status for row in result.rows if row.na]
    if skipped:  # a row of the table, not an empty run
        tracker.set_tags(result.parent_run_id,
                         {"accel.ablation.not_applicable": "; ".join(skipped)[:5000]})
    for row in result.rows:
        if row.na:
            continue
        run_id = children[row.combo.name]
        med, lo, hi = row.speedup
        tags = {"accel.ablation.status": row.short_status}
        if row.note:
            tags["mlflow.note.content"] = row.note  # shown as the run's description in the UI
        tracker.set_tags(run_id, tags)
        metrics = {"steady_epoch_s": row.median("steady_epoch_s"),
                   "first_epoch_s": row.median("first_epoch_s"),
                   "train_throughput": row.median("throughput"),
                   "peak_memory_mb": row.median("peak_memory_mb"),
                   "val_accuracy": row.median("val_accuracy"),
                   "time_to_target_s": row.median("time_to_target_s"),
                   "speedup": med, "speedup_min": lo, "speedup_max": hi,
                   "runs_ok": float(len(row.ok))}
        if not row.na:
            tracker.log_metrics(run_id, {k: v for k, v in metrics.items() if not math.isnan(v)},
                                step=0)
        if not math.isnan(med):
            parent_metrics[f"speedup.{row.combo.key}"] = med
        tracker.end_run(run_id, "FAILED" if row.status == "failed" else "FINISHED")
    parent = result.parent_run_id
    if parent_metrics:
        tracker.log_metrics(parent, parent_metrics, step=0)
    _log_tables(tracker, result, cfg)


def _log_tables(tracker, result: Ablation, cfg: Config) -> None:
    import matplotlib.pyplot as plt

    parent = result.parent_run_id
    tracker.log_text(parent, result.markdown(), "ablation.md")
    tracker.log_text(parent, csv_table(result.rows, result.plan), "ablation.csv")
    tracker.log_text(parent, runs_csv(result.records), "ablation_runs.csv")
    title = (f"{cfg.name}: {cfg.model.name} on {cfg.data.dataset}, {result.plan.device}, "
             f"{result.repeats} repeat(s)")
    fig = speedup_figure(result.rows, title)
    tracker.log_figure(parent, fig, "speedup.png")
    plt.close(fig)


def _end_runs(tracker, parent: str, children: dict[str, str], status: str) -> None:
    """Close what is still open: children as FAILED (KILLED on Ctrl-C), the parent as `status`."""
    for run_id in children.values():
        if tracker.client.get_run(run_id).info.status == "RUNNING":
            tracker.end_run(run_id, "KILLED" if status == "KILLED" else "FAILED")
    tracker.end_run(parent, status)
