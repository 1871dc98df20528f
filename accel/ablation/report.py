"""What an ablation shows: one row per combination (medians, spread, paired speed-ups), as a
markdown table, CSV, a speed-up figure, and the header that says what was compared where."""

from __future__ import annotations

import csv
import io
import math
import statistics
import time
from dataclasses import dataclass, field

from accel.ablation.plan import BASELINE, AblationPlan, Combination, not_applicable
from accel.ablation.record import RunRecord
from accel.ablation.split import split_table
from accel.config import Config
from accel.console import MISSING, fmt


@dataclass
class Row:
    combo: Combination
    status: str  # "ok", "2/3 ok", "failed", or the n/a reason
    records: list[RunRecord] = field(default_factory=list)
    speedups: list[float] = field(default_factory=list)  # paired by repeat with the baseline
    acc_diffs: list[float] = field(default_factory=list)  # val_accuracy - the baseline's, paired

    @property
    def na(self) -> bool:
        return self.status.startswith("n/a")

    @property
    def short_status(self) -> str:
        """The status as a table cell: "n/a" without its reason."""
        return "n/a" if self.na else self.status

    @property
    def note(self) -> str:
        """Why the row is n/a, or the distinct errors of its failed runs."""
        if self.na:
            return self.status
        return "; ".join(sorted({r.error for r in self.records if r.error}))

    @property
    def ok(self) -> list[RunRecord]:
        return [r for r in self.records if r.ok]

    def median(self, attr: str) -> float:
        """The median over the runs that succeeded and have the value (not nan)."""
        values = [v for r in self.ok if not math.isnan(v := getattr(r, attr))]
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

    def intervals(self):
        """95% Student-t intervals (accel.verify.stats) of the mean speed-up and of the mean
        accuracy difference to the baseline, both paired by repeat (each repeat its own seed);
        None below two repeats."""
        from accel.verify.stats import t_interval

        if len(self.speedups) < 2 or self.combo.name == BASELINE:
            return None, None
        accuracy = t_interval(self.acc_diffs) if len(self.acc_diffs) >= 2 else None
        return t_interval(self.speedups), accuracy

    @property
    def faster(self) -> bool | None:
        """True / False where the speed-up's interval excludes 1; None where it cannot say."""
        speed, _ = self.intervals()
        return None if speed is None or not speed.excludes(1.0) else speed.low > 1

    @property
    def more_accurate(self) -> bool | None:
        """True / False where the accuracy difference's interval excludes 0; None otherwise."""
        _, accuracy = self.intervals()
        return None if accuracy is None or not accuracy.excludes(0.0) else accuracy.low > 0

    @property
    def beyond_noise(self) -> str:
        """What the intervals exclude: a speed-up of 1 (faster / slower), no accuracy change.
        No verdict from one seed, or from an interval that includes the no-change value."""
        if self.combo.name == BASELINE or not self.speedups:
            return MISSING
        if len(self.speedups) == 1:
            return "one seed: no interval"
        words = [{True: "faster", False: "slower", None: "same speed"}[self.faster]]
        if self.more_accurate is not None:
            words.append("higher acc" if self.more_accurate else "lower acc")
        return ", ".join(words) if words != ["same speed"] else "no (noise)"


def summarize(combos: list[Combination], records: list[RunRecord],
              plan: AblationPlan) -> list[Row]:
    """Speed-up = baseline / combination steady time, paired by repeat."""
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
        paired = [(base[r.repeat], r) for r in mine if r.ok and r.repeat in base]
        speedups = [b.steady_epoch_s / r.steady_epoch_s for b, r in paired]
        acc_diffs = [r.val_accuracy - b.val_accuracy for b, r in paired
                     if not math.isnan(r.val_accuracy - b.val_accuracy)]
        rows.append(Row(combo, status, mine, speedups, acc_diffs))
    return rows


def _technique_cell(row: Row, technique: str, plan: AblationPlan) -> str:
    if technique not in row.combo.on:
        return "off"
    if technique == "pm" and plan.device != "cuda" or technique == "ddp" and plan.ranks < 2:
        return "n/a"
    return "on"


def _speedup_cell(row: Row) -> str:
    if row.na:
        return row.status.split(":")[0]
    med, lo, hi = row.speedup
    if math.isnan(med):
        return "failed" if row.status == "failed" else f"{MISSING} (no baseline)"
    return f"{med:.2f}x ({lo:.2f}–{hi:.2f})"


def _interval_cells(row: Row) -> list[str]:
    """The speed-up's and the accuracy difference's 95% intervals, and what they exclude."""
    speed, accuracy = row.intervals()
    speed_cell = f"[{speed.low:.2f}, {speed.high:.2f}]" if speed else MISSING
    return [speed_cell, accuracy_cell(row), row.beyond_noise]


def accuracy_cell(row: Row) -> str:
    """'+0.4 pp [-1.2, +2.0]'; one seed: its difference and 'no interval'; no spread: said."""
    _, accuracy = row.intervals()
    if accuracy is None:
        if len(row.acc_diffs) == 1 and row.combo.name != BASELINE:
            return f"{100 * row.acc_diffs[0]:+.1f} pp (one seed: no interval)"
        return MISSING
    if not accuracy.spread:
        return f"{100 * accuracy.mean:+.1f} pp (no spread over {accuracy.n} seeds: no interval)"
    return (f"{100 * accuracy.mean:+.1f} pp [{100 * accuracy.low:+.1f}, "
            f"{100 * accuracy.high:+.1f}]")


def target_name(target: dict) -> str:
    sign = "<=" if target["metric"] == "val_loss" else ">="
    return f"{target['metric']} {sign} {target['value']}"


def _target_cell(row: Row) -> str:
    """Median training seconds to the target (min–max), over the runs that reached it."""
    reached = [r.time_to_target_s for r in row.ok if not math.isnan(r.time_to_target_s)]
    if not row.ok:
        return MISSING
    if not reached:
        return "not reached"
    cell = f"{statistics.median(reached):.1f} ({min(reached):.1f}–{max(reached):.1f})"
    return cell if len(reached) == len(row.ok) else f"{cell}, {len(reached)}/{len(row.ok)} runs"


def markdown_table(rows: list[Row], plan: AblationPlan) -> str:
    target = [f"s to {target_name(plan.target)} (min–max)"] if plan.target else []
    head = ["combination", *plan.techniques, "status", "steady s/epoch (min–max)", *target,
            "speed-up (min–max)", "speed-up 95% CI", "val acc vs baseline (95% CI)",
            "beyond noise", "1st epoch s", "img/s", "peak MB", "val acc", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lo, hi = row.spread("steady_epoch_s")
        steady = (f"{fmt(row.median('steady_epoch_s'), 2)} ({fmt(lo, 2)}–{fmt(hi, 2)})"
                  if row.ok else MISSING)
        cells = [row.combo.name, *(_technique_cell(row, t, plan) for t in plan.techniques),
                 row.short_status, steady, *([_target_cell(row)] if target else []),
                 _speedup_cell(row), *_interval_cells(row),
                 fmt(row.median("first_epoch_s"), 2), fmt(row.median("throughput"), 0),
                 fmt(row.median("peak_memory_mb"), 0), fmt(row.median("val_accuracy"), 3),
                 row.note.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


CSV_FIELDS = ("combination", "status", "runs_ok", "repeats", "steady_epoch_s_median",
              "steady_epoch_s_min", "steady_epoch_s_max", "speedup_median", "speedup_min",
              "speedup_max", "first_epoch_s_median", "warmup_s_median", "throughput_median",
              "peak_memory_mb_median", "val_accuracy_median", "time_to_target_s_median",
              "epochs_to_target_median", "speedup_ci_low", "speedup_ci_high",
              "acc_diff_mean", "acc_diff_ci_low", "acc_diff_ci_high", "beyond_noise", "note")


def csv_table(rows: list[Row], plan: AblationPlan) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["combination", *plan.techniques, *CSV_FIELDS[1:]])
    for row in rows:
        lo, hi = row.spread("steady_epoch_s")
        med, s_lo, s_hi = row.speedup
        warmups = [r.first_epoch_s - r.steady_epoch_s for r in row.ok]
        writer.writerow([
            row.combo.name, *(_technique_cell(row, t, plan) for t in plan.techniques),
            row.short_status, len(row.ok), len(row.records),
            row.median("steady_epoch_s"), lo, hi, med, s_lo, s_hi, row.median("first_epoch_s"),
            statistics.median(warmups) if warmups else math.nan, row.median("throughput"),
            row.median("peak_memory_mb"), row.median("val_accuracy"),
            row.median("time_to_target_s"), row.median("epochs_to_target"),
            *_interval_values(row), row.beyond_noise, row.note,
        ])
    return out.getvalue()


def _interval_values(row: Row) -> list[float]:
    speed, accuracy = row.intervals()
    nan = math.nan
    return [speed.low if speed else nan, speed.high if speed else nan,
            *((accuracy.mean, accuracy.low, accuracy.high) if accuracy else (nan, nan, nan))]


RUN_FIELDS = ("combination", "repeat", "seed", "run_id", "ok", "error", "epochs",
              "first_epoch_s", "steady_epoch_s", "throughput", "peak_memory_mb", "val_accuracy",
              "time_to_target_s", "epochs_to_target")


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


def describe_plan(cfg: Config, plan: AblationPlan, repeats: int, device_name: str) -> str:
    limit = cfg.data.train_limit
    images = (f"{plan.updates_per_epoch * plan.effective_batch} images"
              if plan.updates_per_epoch else f"{limit} training images" if limit
              else "the whole training split")
    lines = [
        f"ablation of {', '.join(plan.techniques)} on {device_name}: model {cfg.model.name}, "
        f"data {cfg.data.dataset}, {cfg.train.epochs} epochs of {images}, "
        f"{repeats} repeat(s), {seeds_said(cfg.train.seed, repeats)}",
        f"effective batch {plan.effective_batch} in every combination"
        + (f"; ga on = {plan.ga_steps} x {plan.micro_batch(True)}, "
           f"off = 1 x {plan.effective_batch}" if "ga" in plan.techniques else ""),
    ]
    if "amp" in plan.techniques:
        scaler = " + GradScaler" if plan.amp == "fp16" else ""
        cpu = ("; on CPU train.amp=auto picks bf16 or fp32 by a probe, so these rows show "
               f"what an explicit train.amp={plan.amp} gives" if plan.device == "cpu" else "")
        lines.append(f"amp on = autocast {plan.amp}{scaler}, off = fp32{cpu}")
    if "resident" in plan.techniques:
        where = ("in memory, augmented in batches (a CPU has no copy to save)"
                 if plan.device == "cpu" else "on the GPU, augmented there in batches")
        lines.append(f"resident on = data.on_device=true: each split one tensor {where}; "
                     f"off = the config's DataLoader (data.in_memory={cfg.data.in_memory})")
    if "ddp" in plan.techniques:
        lines.append(f"ddp on = {plan.ranks} ranks, one GPU each, each micro-batch shared out"
                     " among them; off = one process"
                     if plan.ranks > 1 else
                     f"ddp: n/a on {plan.device}, which has fewer than two GPUs")
    if plan.target:
        lines.append(f"time to target = training seconds (evaluation excluded) until the first "
                     f"epoch with {target_name(plan.target)}; median over the runs reaching it")
    lines.append("steady s/epoch = median over epochs 2.. (epoch 1 apart: warm-up, compile); "
                 "speed-up = baseline / combination, paired by repeat; spread = min–max; 95% CI = "
                 "Student-t interval of the mean over repeats (differences paired by seed); "
                 "beyond noise = what the intervals exclude (a speed-up of 1, no accuracy "
                 "change): no verdict from one seed or from an interval that includes it")
    if repeats < 5:
        lines.append(f"{repeats} repeat(s): an interval from so few is wide, and only large "
                     "effects clear it; --repeats 5 or more narrows it")
    if cfg.train.epochs < 2:
        lines.append("train.epochs=1: no steady state; the times include warm-up (use >= 2)")
    lines.append(f"at start: {busy_elsewhere()}")
    return "\n".join(lines)


def seeds_said(first: int, repeats: int) -> str:
    if repeats == 1:
        return f"seed {first} (one seed: no interval)"
    return (f"seeds {first}..{first + repeats - 1}, one per repeat, the same in every "
            "combination")


def busy_elsewhere(sample_s: float = 0.5) -> str:
    """How many cores other processes keep busy now (this one sleeps while it samples): a
    busy machine slows every combination, so the header says it. Not the load average, whose
    minutes of memory count this command's own earlier work."""
    import os

    def ticks() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return sum(values), values[3] + values[4]  # all, idle + iowait

    try:
        total0, idle0 = ticks()
        time.sleep(sample_s)
        total1, idle1 = ticks()
    except (OSError, ValueError, IndexError):
        return f"load average {load_average()}"
    cores = os.cpu_count() or 1
    busy = cores * (1 - (idle1 - idle0) / max(1, total1 - total0))
    shared = "; other processes share the CPU" if busy >= 0.25 else ""
    return f"{busy:.1f} of {cores} cores busy with other processes{shared}"


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


@dataclass
class Ablation:
    """Everything one `accel ablate` measured, and its table."""

    plan: AblationPlan
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
        split = split_table(self.rows)
        return (self.header + "\n\n" + markdown_table(self.rows, self.plan) + "\n"
                + (f"\n{split}" if split else "") + footer)
