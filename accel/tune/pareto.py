"""Multi-objective studies: the Pareto front (the COMPLETE trials no other complete trial beats
on every objective at once), what the parent run shows of it, and picking one trial from it.

A study's objectives are its metric names (set when it is created) and directions; a
single-objective study has one of each.
"""

from __future__ import annotations

import csv
import io

from accel.config import ConfigError


def objective_names(study) -> list[str]:
    return list(study.metric_names or [f"objective_{i}" for i in range(len(study.directions))])


def is_multi(study) -> bool:
    return len(study.directions) > 1


def front(study) -> list:
    """The Pareto front, by trial number; empty while no trial is COMPLETE."""
    return sorted(study.best_trials, key=lambda t: t.number)


def _maximize(study) -> list[bool]:
    return [d.name == "MAXIMIZE" for d in study.directions]


def best_values(study, trials: list) -> dict[str, float]:
    """Per objective, the best value on the front: `best_<metric>` on the parent run."""
    names, up = objective_names(study), _maximize(study)
    out = {}
    for i, name in enumerate(names):
        values = [t.values[i] for t in trials]
        out[f"best_{name}"] = max(values) if up[i] else min(values)
    return out


def pareto_csv(study, trials: list, run_of) -> str:
    """One row per trial of the front: number, MLflow run, objective values, searched params."""
    names = objective_names(study)
    params = sorted({k for t in trials for k in t.params})
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["number", "run_id", *names, *params])
    for t in trials:
        writer.writerow([t.number, run_of(t) or "", *t.values,
                         *(t.params.get(k, "") for k in params)])
    return out.getvalue()


def pick(study, trials: list, metric: str):
    """The trial of `trials` best on `metric` (`accel best --pick`); ConfigError for a metric
    that is not one of the study's objectives."""
    names = objective_names(study)
    if metric not in names:
        raise ConfigError(f"--pick {metric}: not an objective of study '{study.study_name}'; "
                          f"its objectives: {', '.join(names)}")
    i, up = names.index(metric), _maximize(study)[names.index(metric)]
    return (max if up else min)(trials, key=lambda t: t.values[i])


def named_values(study, values: list[float]) -> str:
    """`metric=value` for each objective, as trial lines and the front show them."""
    return " ".join(f"{n}={v:.4g}" for n, v in zip(objective_names(study), values, strict=True))
