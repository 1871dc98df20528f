"""What each step's output says: its row's key numbers and its part of the report."""

from __future__ import annotations

import re
import statistics

from checks.gpu.records import read
from checks.gpu.runner import Summary

COUNTS = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")
# Published training throughput at 224 px on one A100 (issue's sources): NVIDIA
# DeepLearningExamples (TF32 and AMP), timm's benchmark.py (AMP + channels_last, batch 512).
ANCHORS = {
    "resnet50": {"tf32": 938, "amp": 2470, "note": "DLE A100: TF32 938, AMP 2470 img/s (2.63x);"
                 " timm A100 AMP+channels_last about 2600; channels_last 1.47x with AMP"},
    "efficientnet_b0": {"tf32": 1078, "amp": 2489,
                        "note": "DLE A100: TF32 1078, AMP 2489 img/s (2.31x)"},
    "vit_base_patch16_224": {"note": "timm: channels_last about 1.0x for ViT"},
}


def tests(text: str, dry: bool) -> Summary:
    """pytest's last summary line; on the GPU at least one gpu test must pass, none fail."""
    lines = [ln for ln in text.splitlines()
             if re.search(r" in [\d.]+s", ln) and (COUNTS.search(ln) or "collected" in ln)]
    if not lines:
        return Summary(False, "no pytest summary line")
    last = lines[-1].strip("= ")
    if dry:
        collected = re.search(r"(\d+)(?:/\d+)? tests? collected", last)
        n = int(collected.group(1)) if collected else 0
        return Summary(n > 0, f"{n} gpu test(s) collected (not run: no GPU)")
    counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
              for n, kind in COUNTS.findall(last)}
    ok = counts.get("passed", 0) > 0 and not counts.get("failed") and not counts.get("error")
    return Summary(ok, ", ".join(f"{n} {kind}" for kind, n in counts.items()))


def ablation(text: str) -> Summary:
    """`accel ablate`'s table (stdout) and its closing line: every run must succeed."""
    lines = text.splitlines()
    closing = [ln for ln in lines if ln.startswith("MLflow: parent run ")]
    heads = [i for i, ln in enumerate(lines)  # the speed-up table, not the time split's
             if ln.startswith("| combination |") and "speed-up" in ln]
    if not closing or not heads:
        return Summary(False, "no ablation table in the output")
    start = heads[-1]
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    first = max((i for i in range(start) if lines[i].startswith("ablation of ")), default=start)
    footer = [ln for ln in lines[end:end + 3] if ln.strip() and not ln.startswith("MLflow:")]
    section = "\n".join([*lines[first:end], "", *footer, closing[-1]])
    failed = int(re.search(r"(\d+) failed", closing[-1]).group(1))
    runs = int(re.search(r"(\d+) runs", closing[-1]).group(1))
    names = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = [dict(zip(names, (c.strip() for c in ln.strip("|").split("|")), strict=False))
            for ln in lines[start + 2:end]]
    base = rows[0]  # the all-off baseline comes first
    try:
        best = max(rows[1:] or rows, key=lambda r: speedup(r["speed-up (min–max)"]))
        numbers = (f"{runs} runs, {failed} failed; baseline "
                   f"{base['steady s/epoch (min–max)'].split()[0]} s/epoch, val acc "
                   f"{base['val acc']}; best other {best['combination']} "
                   f"{best['speed-up (min–max)'].split()[0]}")
    except KeyError as e:  # the table's columns were renamed: the table below still says it all
        numbers = f"{runs} runs, {failed} failed (no column {e} in the table)"
    return Summary(failed == 0 and base.get("status") == "ok", numbers, section)


def speedup(cell: str) -> float:
    """'1.84x (1.80–1.90)' -> 1.84; anything else (failed, n/a) sorts last."""
    found = re.match(r"([\d.]+)x", cell)
    return float(found.group(1)) if found else -1.0


def paper(text: str, env: dict) -> Summary:
    """One table per model; the row: each model's best AMP over fp32 and over TF32."""
    rows = [r for r in read(text) if r.get("step") == "paper"]
    if not rows:
        return Summary(False, "no measurement")
    models = list(dict.fromkeys(r["model"] for r in rows))
    parts, cells = [], []
    for model in models:
        table, cell = paper_table(model, [r for r in rows if r["model"] == model])
        parts.append(table)
        cells.append(cell)
    errors = [r for r in rows if "error" in r]
    # A row that failed (out of memory, a compile error) is a result, shown in its table; the
    # step fails only where a model has no number at all.
    measured = {r["model"] for r in rows if "img_s" in r}
    ok = len(models) == 3 and measured == set(models)
    return Summary(ok, "; ".join(cells) + (f"; {len(errors)} row(s) failed" if errors else ""),
                   "\n\n".join([MODES_SAID, *parts]))


MODES_SAID = ("Modes: `fp32 (TF32 off)` = `train.amp=off train.tf32=false`; `TF32` = "
              "`train.amp=off` as accel trains it by default (`train.tf32=true`: TF32 for matmuls "
              "and cuDNN); the AMP rows run with TF32 on. img/s: the median of 3 timed blocks "
              "(their range beside it); cuDNN's autotuner on, as in training. DataLoader rows: "
              "float32 host batches of the size shown, through 2 workers (shared memory), pinned "
              "with PM.")


def paper_table(model: str, rows: list[dict]) -> tuple[str, str]:
    base = {r["mode"]: r.get("img_s") for r in rows}
    fp32, tf32 = base.get("fp32 (TF32 off)"), base.get("TF32")
    anchor = ANCHORS.get(model, {})
    lines = [f"**{model}** ({anchor.get('note', 'no published anchor')})", "",
             "| mode | img/s | 3 blocks | host batch MB | peak GiB | x fp32 | x TF32 | x anchor |"
             " TFLOPS | MFU (measured peak) | MFU (data sheet) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        speed = r.get("img_s")
        if speed is None:
            lines.append(f"| {r['mode']} | {r.get('error') or r.get('skipped')} | | | | | | |"
                         " | | |")
            continue
        key = "tf32" if r["mode"] == "TF32" else "amp" if r["amp"] != "off" else ""
        ref = anchor.get(key)
        spread = f"{r['img_s_min']:.0f}–{r['img_s_max']:.0f}" if "img_s_min" in r else "–"
        host = f"{r['host_batch_mb']:.0f}" if "host_batch_mb" in r else "–"
        lines.append(f"| {r['mode']} | {speed:.0f} | {spread} | {host} |"
                     f" {ratio_text(r.get('peak_gib'), 1, '.1f')} |"
                     f" {ratio_text(speed, fp32)} | {ratio_text(speed, tf32)} |"
                     f" {ratio_text(speed, ref)} | {utilisation_cells(r)} |")
    amp = [r for r in rows if r["amp"] != "off" and r.get("img_s") and not r["loader"]
           and r["accumulation"] == 1]
    best = max(amp, key=lambda r: r["img_s"], default=None)
    cell = f"{model}: " + (f"best AMP {best['mode']} {ratio_text(best['img_s'], fp32)} fp32, "
                           f"{ratio_text(best['img_s'], tf32)} TF32" if best else "no AMP number")
    return "\n".join(lines), cell


def utilisation_cells(r: dict) -> str:
    """Achieved TFLOPS, MFU against the peak measured on this GPU in the row's precision
    (TFLOPS beside it), and against the data sheet's dense figure where the GPU is listed."""
    if r.get("tflops") is None:
        return "– | – | –"
    vendor = (f"{r['mfu_vendor']:.2f} of {r['vendor_tflops']:g}" if r.get("mfu_vendor")
              else "not listed")
    return f"{r['tflops']:.3g} | {r['mfu']:.2f} of {r['peak_tflops']:.3g} | {vendor}"


def ratio_text(a, b, fmt: str = ".2f") -> str:
    if a is None or not b:
        return "–"
    return f"{a / b:{fmt}}" + ("x" if b != 1 else "")


def fast(text: str, env: dict) -> Summary:
    """airbench94's runs and accel's (SGD, then Muon), side by side: seconds, test accuracy,
    time to target."""
    rows = [r for r in read(text) if r.get("step") == "fast"]
    air = [r for r in rows if r["side"] == "airbench94"]
    ours = [r for r in rows if r["side"] == "accel"]
    lines = ["| side | seed | training s | test acc | time to target s | notes |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['side']} | {r['seed']} | {r['seconds']:.2f} | {r['test_acc']:.4f} |"
                     f" {fmt(r.get('time_to_target_s'))} | {r.get('notes', '')} |")
    if not air or not ours:
        return Summary(False, f"{len(air)} airbench94 run(s), {len(ours)} accel run(s)",
                       "\n".join(lines))
    a = statistics.median(r["seconds"] for r in air)
    muon = [r for r in rows if r["side"] == "accel muon"]
    cell = (f"airbench94 {a:.2f} s, {statistics.mean(r['test_acc'] for r in air):.4f} test; "
            f"accel {reach(ours, a)}"
            + (f"; Muon {reach(muon)}" if muon else "; no Muon run within the budget"))
    return Summary(True, cell, "\n".join(lines))


def reach(runs: list[dict], airbench_s: float | None = None) -> str:
    """`4.6 s to target (1.12x airbench94's time), 0.9400 test`: the median time to target
    (its ratio to airbench94's median seconds where given) and the mean test accuracy."""
    reached = [r["time_to_target_s"] for r in runs if r.get("time_to_target_s")]
    said = "did not reach the target"
    if reached:
        said = f"{statistics.median(reached):.1f} s to target"
        if airbench_s:
            said += f" ({statistics.median(reached) / airbench_s:.2f}x airbench94's time)"
    return f"{said}, {statistics.mean(r['test_acc'] for r in runs):.4f} test"


def fmt(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def syncs(text: str, env: dict) -> Summary:
    """Reads per update of the step alone and of the trainer's iteration; CUDA's own count."""
    rows = [r for r in read(text) if r.get("step") == "syncs"]
    if not rows:
        return Summary(False, "no measurement")
    lines = ["| amp | step: host reads / update | trainer: host reads / update | by | "
             "CUDA syncs / update | where (first lines) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['amp']} | {r['step_reads']} | {r['trainer_reads']} | {r['reads_by']} |"
                     f" {fmt(r['cuda_syncs'])} | {'; '.join(r['cuda_where'])} |")
    cell = ", ".join(f"{r['amp']}: step {r['step_reads']}, trainer {r['trainer_reads']}"
                     + ("" if r["cuda_syncs"] is None else f", CUDA {r['cuda_syncs']:.2f}")
                     for r in rows)
    return Summary(True, cell + " per update", "\n".join(lines))
