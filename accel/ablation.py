"""`accel ablate`: time every on/off combination of GA, AMP and PM (and channels_last, compile).

The paper's question, for your model and machine: how much faster does each technique make
training, alone and combined? Every combination trains with the same data, seed, epochs and
effective batch size, through the same `train(cfg)` as everything else.

- `ga`  the config's effective batch (`train.batch_size` x `train.accumulation_steps`) comes from
        `train.accumulation_steps` smaller micro-batches (4 when the config says 1); off, it is
        one micro-batch of the full effective size.
- `amp` autocast in bf16 where the device supports it, else fp16 with a GradScaler.
- `pm`  page-locked DataLoader batches + `non_blocking` copies. It only changes anything with an
        accelerator, so on CPU those combinations are reported "n/a on cpu" and not run.
- `channels_last`, `compile`  the memory-format and `torch.compile` switches.

Timing: `train` stops the clock at the end of each epoch after a device synchronisation (so
queued GPU work is counted) and before validation. The first epoch (kernel selection, compile) is
reported apart; the steady-state time is the median of the later epochs. Repeats run interleaved
(all combinations, then all again, in reversed order every other repeat), so machine drift hits
every combination alike; speed-ups are paired by repeat: baseline time / combination time.
"""

from __future__ import annotations

import argparse
import copy
import csv
import io
import itertools
import math
import statistics
import sys
import time
from dataclasses import dataclass, field

from accel.config import Config, ConfigError

TECHNIQUES = ("ga", "amp", "pm", "channels_last", "compile")
DEFAULT_GA_STEPS = 4  # micro-batches per update for `ga` when the config itself does not use GA
BASELINE = "baseline"


# --- which runs ------------------------------------------------------------------------------


def parse_techniques(text: str) -> tuple[str, ...]:
    """'ga,amp,pm' -> ('ga', 'amp', 'pm'), in the order given; unknown or repeated names fail."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not names:
        raise ConfigError(f"--techniques is empty: choose from {', '.join(TECHNIQUES)}")
    for name in names:
        if name not in TECHNIQUES:
            raise ConfigError(f"--techniques: unknown '{name}'; "
                              f"choose from {', '.join(TECHNIQUES)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--techniques lists a technique twice: {text!r}")
    return tuple(names)


@dataclass(frozen=True)
class Combination:
    techniques: tuple[str, ...]  # all the ablated techniques, in the user's order
    on: frozenset[str]  # the ones switched on here

    @property
    def name(self) -> str:
        return "+".join(t for t in self.techniques if t in self.on) or BASELINE

    @property
    def key(self) -> str:
        """The name as an MLflow metric key (they cannot hold '+')."""
        return self.name.replace("+", "-")

    def without(self, technique: str) -> Combination:
        return Combination(self.techniques, self.on - {technique})


def combinations(techniques: tuple[str, ...]) -> list[Combination]:
    """All 2^k on/off sets: the all-off baseline first, then by how many are on."""
    out = []
    for flags in itertools.product((False, True), repeat=len(techniques)):
        on = frozenset(t for t, f in zip(techniques, flags, strict=True) if f)
        out.append(Combination(techniques, on))
    order = {t: i for i, t in enumerate(techniques)}
    return sorted(out, key=lambda c: (len(c.on), sorted(order[t] for t in c.on)))


@dataclass
class Plan:
    """What each technique means on this device, for this config."""

    techniques: tuple[str, ...]
    device: str  # "cpu" or "cuda"
    effective_batch: int  # images per optimizer update, the same in every combination
    ga_steps: int  # micro-batches per update when `ga` is on
    updates_per_epoch: int | None  # None: the whole training set every epoch
    amp: str  # the autocast dtype of `amp` on: "bf16" or "fp16"

    def micro_batch(self, ga: bool) -> int:
        return self.effective_batch // self.ga_steps if ga else self.effective_batch


def make_plan(cfg: Config, techniques: tuple[str, ...], device) -> Plan:
    t = cfg.train
    effective = t.batch_size * t.accumulation_steps
    ga_steps = t.accumulation_steps if t.accumulation_steps > 1 else DEFAULT_GA_STEPS
    if "ga" in techniques and effective % ga_steps:
        raise ConfigError(
            f"ga: effective batch {effective} (train.batch_size x train.accumulation_steps) "
            f"does not split into {ga_steps} equal micro-batches; pick sizes that divide"
        )
    updates = None
    if t.epoch_length is not None:  # epoch_length counts the config's own micro-batches
        updates = math.ceil(t.epoch_length / t.accumulation_steps)
    amp = amp_dtype(t.amp, device) if "amp" in techniques else t.amp
    return Plan(techniques, device.type, effective, ga_steps, updates, amp)


def amp_dtype(mode: str, device) -> str:
    """`amp` on: the config's explicit bf16/fp16, else bf16 where supported, else fp16 (+scaler)."""
    if mode in ("bf16", "fp16"):
        return mode
    if device.type == "cuda":
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16"  # CPU autocast computes in bf16 (AMX / avx512_bf16 where the CPU has them)


def not_applicable(combo: Combination, plan: Plan) -> str | None:
    """Why this combination cannot differ from another one here, or None when it can."""
    if "pm" in combo.on and plan.device != "cuda":
        return (f"n/a on {plan.device}: pinned memory only speeds host-to-accelerator copies "
                f"(same run as {combo.without('pm').name})")
    return None


def combination_config(base: Config, combo: Combination, plan: Plan) -> Config:
    """`base` with the ablated switches set for `combo`; everything else stays as configured."""
    cfg = copy.deepcopy(base)
    t, d, chosen = cfg.train, cfg.data, plan.techniques
    if "ga" in chosen:
        ga = "ga" in combo.on
        t.batch_size = plan.micro_batch(ga)
        t.accumulation_steps = plan.ga_steps if ga else 1
        if plan.updates_per_epoch is not None:  # the same images per epoch either way
            t.epoch_length = plan.updates_per_epoch * t.accumulation_steps
    if "amp" in chosen:
        t.amp = plan.amp if "amp" in combo.on else "off"
    if "pm" in chosen:
        d.pin_memory = "pm" in combo.on
    if "channels_last" in chosen:
        t.channels_last = "channels_last" in combo.on
    if "compile" in chosen:
        t.compile = "compile" in combo.on
    cfg.tracking.log_checkpoint = False  # 2^k x R weight files would measure nothing
    return cfg


# --- running --------------------------------------------------------------------------------


@dataclass
class RunRecord:
    combination: str
    repeat: int
    run_id: str | None = None
    ok: bool = False
    error: str | None = None
    epochs: int = 0
    first_epoch_s: float = math.nan
    steady_epoch_s: float = math.nan  # median of epochs 2.. (the first epoch when there is one)
    throughput: float = math.nan  # training images/s over the steady epochs
    peak_memory_mb: float = math.nan
    val_accuracy: float = math.nan


def record_from_history(record: RunRecord, history: list[dict[str, float]]) -> RunRecord:
    times = [h["epoch_time_s"] for h in history]
    steady = history[1:] or history  # one epoch: no steady state apart from warm-up
    record.epochs = len(history)
    record.first_epoch_s = times[0]
    record.steady_epoch_s = statistics.median(h["epoch_time_s"] for h in steady)
    record.throughput = statistics.median(h["train_throughput"] for h in steady)
    record.peak_memory_mb = max(h["peak_memory_mb"] for h in history)
    record.val_accuracy = history[-1]["val_accuracy"]
    return record


def reset_peak_memory(device) -> None:
    """Each run reports its own peak, not the process's so far.

    CUDA: `train` resets the allocator's counter itself. CPU: `train` reads the process's max
    RSS, which Linux resets to the current RSS when "5" is written to /proc/self/clear_refs.
    """
    if device.type != "cpu":
        return
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
    record = RunRecord(combo.name, repeat)
    if cfg.train.compile:
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
        record.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        if device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        return record
    record.run_id, record.ok = result.run_id, True
    return record_from_history(record, result.history)


def schedule(combos: list[Combination], repeats: int) -> list[tuple[int, Combination]]:
    """Repeat-major, every other repeat reversed: a slow drift of the machine (heat, a
    neighbour's job) lands on all combinations alike instead of on the last ones."""
    order = []
    for r in range(repeats):
        order += [(r, c) for c in (combos if r % 2 == 0 else combos[::-1])]
    return order


# --- summarising ----------------------------------------------------------------------------


@dataclass
class Row:
    combo: Combination
    status: str  # "ok", "2/3 ok", "failed", or the n/a reason
    records: list[RunRecord] = field(default_factory=list)
    speedups: list[float] = field(default_factory=list)  # paired by repeat with the baseline

    @property
    def ok(self) -> list[RunRecord]:
        return [r for r in self.records if r.ok]

    def median(self, attr: str) -> float:
        values = [getattr(r, attr) for r in self.ok]
        return statistics.median(values) if values else math.nan

    def spread(self, attr: str) -> tuple[float, float]:
        values = [getattr(r, attr) for r in self.ok]
        return (min(values), max(values)) if values else (math.nan, math.nan)

    @property
    def speedup(self) -> tuple[float, float, float]:
        """(median, min, max) of the per-repeat speed-ups."""
        if not self.speedups:
            return math.nan, math.nan, math.nan
        return statistics.median(self.speedups), min(self.speedups), max(self.speedups)


def summarize(combos: list[Combination], records: list[RunRecord], plan: Plan) -> list[Row]:
    base = {r.repeat: r for r in records if r.combination == BASELINE and r.ok}
    rows = []
    for combo in combos:
        reason = not_applicable(combo, plan)
        if reason:
            rows.append(Row(combo, reason))
            continue
        mine = sorted((r for r in records if r.combination == combo.name), key=lambda r: r.repeat)
        n_ok = sum(r.ok for r in mine)
        status = "ok" if n_ok == len(mine) else f"{n_ok}/{len(mine)} ok" if n_ok else "failed"
        speedups = [base[r.repeat].steady_epoch_s / r.steady_epoch_s
                    for r in mine if r.ok and r.repeat in base]
        rows.append(Row(combo, status, mine, speedups))
    return rows


def _fmt(value: float, digits: int = 2) -> str:
    return "—" if math.isnan(value) else f"{value:.{digits}f}"


def _technique_cell(row: Row, technique: str, plan: Plan) -> str:
    if technique not in row.combo.on:
        return "off"
    return "n/a" if technique == "pm" and plan.device != "cuda" else "on"


def _speedup_cell(row: Row) -> str:
    if row.status.startswith("n/a"):
        return row.status.split(":")[0]
    med, lo, hi = row.speedup
    if math.isnan(med):
        return "failed" if row.status == "failed" else "— (no baseline)"
    return f"{med:.2f}x ({lo:.2f}–{hi:.2f})"


def _note(row: Row) -> str:
    if row.status.startswith("n/a"):
        return row.status
    errors = sorted({r.error for r in row.records if r.error})
    return "; ".join(errors)


def markdown_table(rows: list[Row], plan: Plan) -> str:
    head = ["combination", *plan.techniques, "status", "steady s/epoch (min–max)",
            "speed-up (min–max)", "1st epoch s", "img/s", "peak MB", "val acc", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lo, hi = row.spread("steady_epoch_s")
        steady = (f"{_fmt(row.median('steady_epoch_s'))} ({_fmt(lo)}–{_fmt(hi)})"
                  if row.ok else "—")
        cells = [row.combo.name, *(_technique_cell(row, t, plan) for t in plan.techniques),
                 "n/a" if row.status.startswith("n/a") else row.status, steady, _speedup_cell(row),
                 _fmt(row.median("first_epoch_s")), _fmt(row.median("throughput"), 0),
                 _fmt(row.median("peak_memory_mb"), 0), _fmt(row.median("val_accuracy"), 3),
                 _note(row).replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


CSV_FIELDS = ("combination", "status", "runs_ok", "repeats", "steady_epoch_s_median",
              "steady_epoch_s_min", "steady_epoch_s_max", "speedup_median", "speedup_min",
              "speedup_max", "first_epoch_s_median", "warmup_s_median", "throughput_median",
              "peak_memory_mb_median", "val_accuracy_median", "note")


def csv_table(rows: list[Row], plan: Plan) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["combination", *plan.techniques, *CSV_FIELDS[1:]])
    for row in rows:
        lo, hi = row.spread("steady_epoch_s")
        med, s_lo, s_hi = row.speedup
        warmups = [r.first_epoch_s - r.steady_epoch_s for r in row.ok]
        writer.writerow([
            row.combo.name, *(_technique_cell(row, t, plan) for t in plan.techniques),
            "n/a" if row.status.startswith("n/a") else row.status, len(row.ok), len(row.records),
            row.median("steady_epoch_s"), lo, hi, med, s_lo, s_hi, row.median("first_epoch_s"),
            statistics.median(warmups) if warmups else math.nan, row.median("throughput"),
            row.median("peak_memory_mb"), row.median("val_accuracy"), _note(row),
        ])
    return out.getvalue()


RUN_FIELDS = ("combination", "repeat", "run_id", "ok", "error", "epochs", "first_epoch_s",
              "steady_epoch_s", "throughput", "peak_memory_mb", "val_accuracy")


def runs_csv(records: list[RunRecord]) -> str:
    """Every run's own numbers, so the medians above can be checked."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(RUN_FIELDS)
    for r in sorted(records, key=lambda r: (r.combination, r.repeat)):
        writer.writerow([getattr(r, f) for f in RUN_FIELDS])
    return out.getvalue()


def speedup_figure(rows: list[Row], title: str):
    """Horizontal bars: median speed-up vs the baseline, error bars from min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.5))
    for y, row in enumerate(rows):
        med, lo, hi = row.speedup
        if math.isnan(med):
            ax.text(1.0, y, f"  {_speedup_cell(row)}", va="center", fontsize=8, color="gray")
            continue
        ax.barh(y, med, color="tab:blue" if row.status == "ok" else "tab:orange",
                xerr=[[med - lo], [hi - med]], capsize=3)
        ax.text(hi, y, f"  {med:.2f}x", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [row.combo.name for row in rows])
    ax.set_ylim(len(rows) - 0.4, -0.6)  # top to bottom, with room for the last label
    ax.set_xlabel("speed-up vs all-off baseline (steady-state s/epoch; >1 is faster)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def describe_plan(cfg: Config, plan: Plan, repeats: int, device_name: str) -> str:
    limit = cfg.data.train_limit
    images = (f"{plan.updates_per_epoch * plan.effective_batch} images"
              if plan.updates_per_epoch else f"{limit} training images" if limit
              else "the whole training split")
    lines = [
        f"ablation of {', '.join(plan.techniques)} on {device_name}: model {cfg.model.name}, "
        f"data {cfg.data.dataset}, {cfg.train.epochs} epochs of {images}, "
        f"{repeats} repeat(s), seed {cfg.train.seed}",
        f"effective batch {plan.effective_batch} in every combination"
        + (f"; ga on = {plan.ga_steps} x {plan.micro_batch(True)}, "
           f"off = 1 x {plan.effective_batch}" if "ga" in plan.techniques else ""),
    ]
    if "amp" in plan.techniques:
        scaler = " + GradScaler" if plan.amp == "fp16" else ""
        lines.append(f"amp on = autocast {plan.amp}{scaler}, off = fp32")
    lines.append("steady s/epoch = median over epochs 2.. (epoch 1 apart: warm-up, compile); "
                 "speed-up = baseline / combination, paired by repeat; spread = min–max")
    if cfg.train.epochs < 2:
        lines.append("train.epochs=1: no steady state; the times include warm-up (use >= 2)")
    lines.append(f"load average at start: {load_average()} (other processes share the CPU)")
    return "\n".join(lines)


def load_average() -> str:
    """1/5/15-minute load: a busy machine slows every combination, so the table says it."""
    import os

    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def device_name(device) -> str:
    import os

    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    from accel.tracking import cpu_name

    threads = torch.get_num_threads()
    return (f"cpu: {cpu_name()}, {os.cpu_count()} cores, {threads} torch "
            f"thread{'s' if threads != 1 else ''}, no GPU, torch {torch.__version__}")


# --- the command ----------------------------------------------------------------------------


@dataclass
class Ablation:
    plan: Plan
    rows: list[Row]
    records: list[RunRecord]
    header: str
    repeats: int
    parent_run_id: str | None = None
    footer: str = ""

    @property
    def baseline_ok(self) -> bool:
        return bool(self.rows and self.rows[0].ok)

    def markdown(self) -> str:
        footer = f"\n{self.footer}\n" if self.footer else ""
        return self.header + "\n\n" + markdown_table(self.rows, self.plan) + "\n" + footer


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _warm_data(cfg: Config, device) -> None:
    """Decode an in-memory dataset before the first run, so it is not charged to the baseline."""
    if cfg.data.in_memory and cfg.data.dataset != "digits":
        from accel.data import build_data

        build_data(cfg, device)


def run_ablation(cfg: Config, techniques: tuple[str, ...], repeats: int, *,
                 tracker=None) -> Ablation:
    """All runs; with a tracker, the parent (`accel.role=ablation`) and its children are logged."""
    from accel.engine import resolve_device
    from accel.models import check_model_name

    if repeats < 1:
        raise ConfigError(f"--repeats {repeats}: must be >= 1")
    check_model_name(cfg.model.name)
    device = resolve_device(cfg.train.device)
    plan = make_plan(cfg, techniques, device)
    combos = combinations(techniques)
    header = describe_plan(cfg, plan, repeats, device_name(device))
    _log(header)
    experiment = cfg.tracking.experiment or cfg.name

    parent, children = None, {}
    if tracker is not None:
        parent = _start_parent(tracker, cfg, plan, repeats, experiment, device)
        children = {c.name: _start_child(tracker, c, cfg, plan, experiment, parent)
                    for c in combos}

    records: list[RunRecord] = []
    statuses = {"parent": "FAILED"}
    began = time.perf_counter()
    try:
        _warm_data(cfg, device)
        todo = [(r, c) for r, c in schedule(combos, repeats) if not not_applicable(c, plan)]
        for i, (r, combo) in enumerate(todo, 1):
            run_cfg = combination_config(cfg, combo, plan)
            if tracker is not None:
                run_cfg.tracking.uri, run_cfg.tracking.experiment = tracker.uri, experiment
            started = time.perf_counter()
            rec = run_one(run_cfg, combo, r, parent_run_id=children.get(combo.name),
                          track=tracker is not None)
            records.append(rec)
            _log(f"[{i}/{len(todo)}] r{r + 1} {combo.name}: " + (
                f"{rec.steady_epoch_s:.2f} s/epoch steady, first {rec.first_epoch_s:.2f} s, "
                f"{rec.throughput:.0f} img/s, val_acc {rec.val_accuracy:.3f}"
                if rec.ok else f"FAILED ({rec.error})")
                + f"  [{time.perf_counter() - started:.0f} s]")
        rows = summarize(combos, records, plan)
        footer = (f"{len(records)} runs in {time.perf_counter() - began:.0f} s; "
                  f"load average at end: {load_average()}")
        result = Ablation(plan, rows, records, header, repeats, parent, footer)
        if tracker is not None:
            _log_results(tracker, result, children, cfg)
        statuses["parent"] = "FINISHED" if result.baseline_ok else "FAILED"
        return result
    except KeyboardInterrupt:
        statuses["parent"] = "KILLED"
        raise
    finally:
        if tracker is not None:
            for run_id in children.values():
                if tracker.client.get_run(run_id).info.status == "RUNNING":
                    tracker.end_run(run_id, "KILLED" if statuses["parent"] == "KILLED"
                                    else "FAILED")
            tracker.end_run(parent, statuses["parent"])


def _start_parent(tracker, cfg: Config, plan: Plan, repeats: int, experiment: str, device) -> str:
    from accel.tracking import environment, scratch_dir, write_json

    run_id = tracker.start_run(
        experiment, f"ablation {','.join(plan.techniques)}",
        tags={"accel.role": "ablation", "accel.ablation.techniques": ",".join(plan.techniques),
              "accel.ablation.repeats": str(repeats), "accel.device": str(device)},
    )
    tracker.log_params(run_id, {
        **cfg.flat(), "ablation.techniques": ",".join(plan.techniques),
        "ablation.repeats": repeats, "ablation.effective_batch_size": plan.effective_batch,
        "ablation.ga_steps": plan.ga_steps, "ablation.amp": plan.amp,
        "ablation.updates_per_epoch": plan.updates_per_epoch,
    })
    tracker.log_text(run_id, cfg.to_yaml(), "config.yaml")
    with scratch_dir() as tmp:
        tracker.log_artifact(run_id, write_json(environment(str(device), cfg.train.seed), tmp,
                                                "environment.json"))
    return run_id


def _start_child(tracker, combo: Combination, cfg: Config, plan: Plan, experiment: str,
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
                   "train.channels_last": resolved.train.channels_last,
                   "train.compile": resolved.train.compile})
    tracker.log_params(run_id, params)
    return run_id


def _log_results(tracker, result: Ablation, children: dict[str, str], cfg: Config) -> None:
    parent_metrics = {}
    for row in result.rows:
        run_id = children[row.combo.name]
        med, lo, hi = row.speedup
        tags = {"accel.ablation.status": "n/a" if row.status.startswith("n/a") else row.status}
        note = _note(row)
        if note:
            tags["mlflow.note.content"] = note  # shown as the run's description in the UI
        tracker.set_tags(run_id, tags)
        metrics = {"steady_epoch_s": row.median("steady_epoch_s"),
                   "first_epoch_s": row.median("first_epoch_s"),
                   "train_throughput": row.median("throughput"),
                   "peak_memory_mb": row.median("peak_memory_mb"),
                   "val_accuracy": row.median("val_accuracy"),
                   "speedup": med, "speedup_min": lo, "speedup_max": hi,
                   "runs_ok": float(len(row.ok))}
        finite = {k: v for k, v in metrics.items() if not math.isnan(v)}
        if not row.status.startswith("n/a"):
            tracker.log_metrics(run_id, finite, step=0)
        if not math.isnan(med):
            parent_metrics[f"speedup.{row.combo.key}"] = med
        status = "FAILED" if row.status == "failed" else "FINISHED"
        tracker.end_run(run_id, status)
    if parent_metrics:
        tracker.log_metrics(result.parent_run_id, parent_metrics, step=0)
    parent = result.parent_run_id
    tracker.log_text(parent, result.markdown(), "ablation.md")
    tracker.log_text(parent, csv_table(result.rows, result.plan), "ablation.csv")
    tracker.log_text(parent, runs_csv(result.records), "ablation_runs.csv")
    title = (f"{cfg.name}: {cfg.model.name} on {cfg.data.dataset}, {result.plan.device}, "
             f"{result.repeats} repeat(s)")
    fig = speedup_figure(result.rows, title)
    tracker.log_figure(parent, fig, "speedup.png")
    import matplotlib.pyplot as plt

    plt.close(fig)


def cli_ablate(args: argparse.Namespace, cfg: Config) -> int:
    from accel.tracking import Tracker

    techniques = parse_techniques(args.techniques)
    if args.tracking_uri:
        cfg.tracking.uri = args.tracking_uri
    tracker = Tracker(cfg.tracking.uri)
    result = run_ablation(cfg, techniques, args.repeats, tracker=tracker)
    print(result.markdown())
    failed = [r for r in result.records if not r.ok]
    print(f"MLflow: parent run {result.parent_run_id} (experiment "
          f"{cfg.tracking.experiment or cfg.name}); {len(result.records)} runs, "
          f"{len(failed)} failed")
    if not result.baseline_ok:
        print("accel: error: the all-off baseline failed in every repeat; no speed-up to report",
              file=sys.stderr)
        return 1
    return 0
