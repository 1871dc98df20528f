"""What `accel best` prints: the best trial's lines, or a multi-objective study's front."""

from __future__ import annotations

from typing import Any

from accel.console import program
from accel.timing import split_said
from accel.tune import pareto
from accel.uris import redact


def print_front(study, counts: str, reproduce, storage_flag: str) -> None:
    front = pareto.front(study)
    objectives = ", ".join(f"{n} ({d.name.lower()})" for n, d in
                           zip(pareto.objective_names(study), study.directions, strict=True))
    print(f"study: {study.study_name} ({len(study.trials)} trials: {counts})")
    print(f"Pareto front over {objectives}: {len(front)} trial(s)")
    for t in front:
        command, run_id = reproduce(t)
        print(f"  trial {t.number}: {pareto.named_values(study, t.values)}  run {run_id}  "
              f"reproduce: {command}")
    print(f"pick one (the front's best on a metric): {program()} best --study {study.study_name}"
          f"{storage_flag} --pick {'|'.join(pareto.objective_names(study))}")


def best_lines(name, states, counts, best, metric, value, run_id, uri, command) -> list[str]:
    lines = [f"study: {name} ({len(states)} trials: {counts})",
             f"best trial: {best.number}",
             f"{metric}: {value:.6g}",
             "params:"]
    lines += [f"  {k}: {_show(v)}" for k, v in best.params.items()]
    lines += [f"mlflow run: {run_id} (experiment {name}, {redact(uri)})",
              f"reproduce: {command}"]
    return lines


def speed_line(run) -> str | None:
    """The best run's last epoch: where its time went and its MFU against the peak measured
    where it trained (accel.timing), or None for a run logged without them."""
    metrics = run.data.metrics
    said = split_said(metrics)
    if not said:
        return None
    if "mfu" in metrics and "peak_tflops" in metrics:
        said += (f"; MFU {metrics['mfu']:.3g} ({metrics['achieved_tflops']:.3g} of "
                 f"{metrics['peak_tflops']:.3g} TFLOPS, peak "
                 f"{run.data.tags.get('accel.peak', 'measured')})")
    return f"last epoch's time: {said}"


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
