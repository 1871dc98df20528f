"""The page of one run (a training run or a trial) and of an ablation's parent run: the same
sections as a study's page, where they apply."""

from __future__ import annotations

import csv
import io
import math
import statistics

from accel.report import figures
from accel.report import records as rec
from accel.report.page import Page, Section, Table, cell
from accel.tracking import retry_locked
from accel.uris import redact

SUMMARY = ("val_accuracy", "val_f1", "val_loss", "test_accuracy", "test_f1", "test_loss",
           "best_epoch", "train_time_s", "train_throughput", "peak_memory_mb")


def _question(tracker, run, what: str) -> Section:
    p = run.data.params
    s = Section("question", "The question")
    s.text.append(f"{what}: {p.get('model.name', '?')} on {p.get('data.dataset', '?')}, "
                  f"{p.get('train.epochs', '?')} epochs, seed {p.get('train.seed', '?')}.")
    s.facts += [("run", f"{run.info.run_name} ({run.info.run_id}), {run.info.status}"),
                *rec.data_facts(run), *rec.machine_facts(rec.environment(tracker,
                                                                          run.info.run_id))]
    config = rec.artifact_text(tracker, run.info.run_id, "config.yaml")
    if config:
        s.blocks.append(("The run's config (config.yaml)", config))
    return s


def _link(uri: str, run, s: Section) -> None:
    url, served = rec.run_page(uri, run.info.experiment_id, run.info.run_id)
    s.links.append((f"The run in the MLflow UI (served by {served})", url))


def _curves(tracker, run) -> Section:
    s = Section("curves", "Learning curves")
    for names, label in ((("val_accuracy", "val_f1"), "accuracy and F1"),
                         (("train_loss", "val_loss"), "loss")):
        histories = {n: rec.history(tracker, run, n) for n in names if n in run.data.metrics}
        fig = figures.curves(histories, label)
        if fig is not None:
            s.figures.append(fig)
    if not s.figures:
        s.text.append("The run logged no per-epoch metric.")
    return s


def _time(tracker, run) -> Section:
    s = Section("time", "Where the time went")
    fig = figures.time_split([(run.info.run_name or run.info.run_id, rec.time_parts(run))])
    if fig is not None:
        s.figures.append(fig)
    s.facts.append(("speed", "; ".join(rec.speed_facts(run)) or "not logged"))
    epochs = rec.history(tracker, run, "epoch_time_s") if "epoch_time_s" in run.data.metrics \
        else []
    if epochs:
        s.tables.append(Table(["epoch", "training time (s)"],
                              [[str(e), f"{v:.3f}"] for _, e, v in epochs]))
    return s


def run_page(tracker, uri: str, run) -> Page:
    """A training run's (or a trial's) page."""
    answer = Section("answer", "The answer")
    metrics = run.data.metrics
    answer.tables.append(Table(["metric", "value"], [[k, cell(metrics[k], 6)]
                                                     for k in SUMMARY if k in metrics],
                               "The run's last logged values (best_* and test_*: the best "
                               "epoch's weights)"))
    _link(uri, run, answer)
    flag = rec.store_flag(uri)
    answer.commands += [("Rerun it from MLflow and compare the numbers",
                         f"accel reproduce {run.info.run_id}{flag}"),
                        ("Train its exact config again (written beside this page)",
                         f"accel train config.yaml{flag}")]
    sure = Section("sure", "How sure")
    sure.text.append("One run with one seed. Reruns with other seeds give the spread.")
    sure.commands.append(("Rerun it with 5 seeds (the logged one and 4 more)",
                          f"accel reproduce {run.info.run_id} --seeds 5{flag}"))
    config = rec.artifact_text(tracker, run.info.run_id, "config.yaml")
    return Page(f"Run {run.info.run_name or run.info.run_id}",
                f"{run.data.tags.get('accel.role', 'run')} run {run.info.run_id}",
                [_question(tracker, run, "One training run"), answer, sure,
                 _curves(tracker, run), _time(tracker, run)],
                f"MLflow {redact(uri)}", {"config.yaml": config} if config else {})


# --- an ablation's parent run ----------------------------------------------------------------


def _rows(text: str | None) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text))) if text else []


def _num(row: dict[str, str], key: str) -> float:
    try:
        return float(row.get(key) or "nan")
    except ValueError:
        return math.nan


def _speedup(row: dict[str, str]) -> tuple[str, float, float, float]:
    """(combination, mean speed-up, its 95% interval); the median where there is no interval."""
    low, high = _num(row, "speedup_ci_low"), _num(row, "speedup_ci_high")
    mean = (low + high) / 2 if not math.isnan(low) else _num(row, "speedup_median")
    return row["combination"], mean, low, high


def _technique_table(rows: list[dict[str, str]]) -> Table:
    head = ["combination", "status", "steady s/epoch", "speed-up (median)", "speed-up 95% CI",
            "val acc vs baseline (mean, 95% CI)", "beyond noise"]
    body = []
    for r in rows:
        low, high = _num(r, "speedup_ci_low"), _num(r, "speedup_ci_high")
        acc = _num(r, "acc_diff_mean")
        body.append([r["combination"], r.get("status", ""), cell(_num(r, "steady_epoch_s_median")),
                     cell(_num(r, "speedup_median"), 3),
                     "—" if math.isnan(low) else f"[{low:.2f}, {high:.2f}]",
                     "—" if math.isnan(acc) else
                     f"{100 * acc:+.1f} pp [{100 * _num(r, 'acc_diff_ci_low'):+.1f}, "
                     f"{100 * _num(r, 'acc_diff_ci_high'):+.1f}]",
                     r.get("beyond_noise", "")])
    return Table(head, body, "Every combination against the all-off baseline, paired by repeat")


def _split_per_combination(tracker, run) -> list[tuple[str, dict[str, float]]]:
    """Per combination, the median over its repeats of each part of the time split."""
    out = []
    children = retry_locked(tracker.client.search_runs, [run.info.experiment_id],
                            f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
    for child in sorted(children, key=lambda r: r.info.start_time or 0):
        repeats = retry_locked(tracker.client.search_runs, [run.info.experiment_id],
                               f"tags.`mlflow.parentRunId` = '{child.info.run_id}'")
        parts: dict[str, list[float]] = {}
        for r in repeats:
            for k, v in rec.time_parts(r).items():
                parts.setdefault(k, []).append(v)
        if parts:
            name = child.data.tags.get("accel.ablation.combination", child.info.run_name)
            out.append((name, {k: statistics.median(v) for k, v in parts.items()}))
    return out


def ablation_page(tracker, uri: str, run) -> Page:
    """`accel ablate`'s page: the technique table with intervals and the split per technique."""
    rows = _rows(rec.artifact_text(tracker, run.info.run_id, "ablation.csv"))
    md = rec.artifact_text(tracker, run.info.run_id, "ablation.md") or ""
    header = md.split("\n\n", 1)[0] if md else ""
    tags = run.data.tags
    q = _question(tracker, run, f"How much faster does each of "
                                f"{tags.get('accel.ablation.techniques', '?')} make training, "
                                "alone and combined, at what accuracy")
    q.facts.append(("repeats", f"{tags.get('accel.ablation.repeats', '?')}, each with its "
                               f"own seed, on {tags.get('accel.device', '?')}"))
    if header:
        q.blocks.append(("What was compared (the table's header)", header))
    answer = Section("answer", "The answer")
    answer.tables.append(_technique_table(rows))
    fig = figures.bars_with_intervals(
        [_speedup(r) for r in rows if r["combination"] != "baseline"],
        "Speed-up against the all-off baseline (mean over repeats, 95% interval)",
        "speed-up (x, steady-state s/epoch of the baseline / the combination; >1 is faster)",
        ["combination", "speed-up (x)", "95% low", "95% high"], reference=1.0)
    if fig is not None:
        answer.figures.append(fig)
    _link(uri, run, answer)
    flag = rec.store_flag(uri)
    answer.commands.append(("Run the ablation again (its config written beside this page)",
                            f"accel ablate config.yaml --techniques "
                            f"{tags.get('accel.ablation.techniques', 'ga,amp,pm')} --repeats "
                            f"{tags.get('accel.ablation.repeats', '3')}{flag}"))
    sure = Section("sure", "How sure")
    sure.text.append("The intervals are 95% Student-t intervals over the repeats (differences "
                     "paired by seed); 'beyond noise' says what they exclude. Few repeats give "
                     "wide intervals: --repeats 5 or more narrows them.")
    time = Section("time", "Where the time went, per technique")
    split = figures.time_split(_split_per_combination(tracker, run),
                               "Time split per combination (median over its repeats)")
    if split is not None:
        time.figures.append(split)
    else:
        time.text.append("No repeat run logged its time.")
    config = rec.artifact_text(tracker, run.info.run_id, "config.yaml")
    return Page(f"Ablation {tags.get('accel.ablation.techniques', '')}".strip(),
                f"{run.info.run_name} (run {run.info.run_id})", [q, answer, sure, time],
                f"MLflow {redact(uri)}", {"config.yaml": config} if config else {})
