"""The report's figures (plotly; Optuna's own plots where one fits), each with a title, axis
labels with units, and a table of the numbers it draws."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

from accel.report.page import Figure, Table, cell

HEIGHT = 420  # px; the width follows the page


def _layout(fig, title: str, x: str | None = None, y: str | None = None, height: int = HEIGHT):
    fig.update_layout(title_text=title, height=height, template="plotly_white",
                      legend={"orientation": "h", "y": -0.25})
    if x is not None:
        fig.update_xaxes(title_text=x)
    if y is not None:
        fig.update_yaxes(title_text=y)
    return fig


def _target(study, index: int) -> Callable | None:
    """Optuna's `target` for objective `index` (None: a single-objective study's value)."""
    return (lambda t: t.values[index]) if len(study.directions) > 1 else None


def importances(study, names: list[str]) -> Figure | None:
    """Each searched parameter's importance to each objective (Optuna's default evaluator,
    PED-ANOVA), as grouped horizontal bars; None below two complete trials."""
    import plotly.graph_objects as go
    from optuna.importance import get_param_importances

    per: dict[str, dict[str, float]] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, name in enumerate(names):
                per[name] = get_param_importances(study, target=_target(study, i))
    except (ValueError, RuntimeError):  # fewer than two complete trials, or no parameter
        return None
    first = per[names[0]]
    params = sorted({p for values in per.values() for p in values},
                    key=lambda p: -first.get(p, 0.0))  # the most important first
    if not params:
        return None
    fig = go.Figure([go.Bar(name=name, y=params, x=[per[name].get(p, 0.0) for p in params],
                            orientation="h") for name in names])
    fig.update_yaxes(autorange="reversed")
    title = "Parameter importances (PED-ANOVA, each objective's importances sum to 1)"
    _layout(fig, title, "importance (share of the objective's variation, 0-1)", "parameter",
            height=max(300, 60 * len(params) + 160))
    table = Table(["parameter", *(f"importance for {n}" for n in names)],
                  [[p, *(f"{per[n].get(p, 0.0):.3f}" for n in names)] for p in params])
    return Figure(title, fig, table)


def parallel(study, names: list[str], trials: list) -> Figure | None:
    """Optuna's parallel coordinates of the complete trials, coloured by the first objective."""
    import optuna.visualization as ov

    if not trials or not study.best_trials:
        return None
    options = ({"target": _target(study, 0), "target_name": names[0]}
               if len(names) > 1 else {"target_name": names[0]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig = ov.plot_parallel_coordinate(study, **options)
    title = f"Parallel coordinates: every complete trial's parameters and {names[0]}"
    _layout(fig, title, height=460)
    params = sorted({k for t in trials for k in t.params})
    rows = [[str(t.number), *(cell(v) for v in t.values), *(cell(t.params.get(k))
                                                            for k in params)] for t in trials]
    return Figure(title, fig, Table(["trial", *names, *params], rows))


def pareto(study, names: list[str], front: list, run_of) -> Figure | None:
    """Optuna's Pareto-front plot (2 or 3 objectives): the front against the other trials."""
    import optuna.visualization as ov

    if not front or len(names) > 3:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig = ov.plot_pareto_front(study, target_names=names)
    title = f"Pareto front over {', '.join(names)}"
    _layout(fig, title, height=460)
    rows = [[str(t.number), *(cell(v) for v in t.values), run_of(t) or ""] for t in front]
    return Figure(title, fig, Table(["trial", *names, "MLflow run"], rows))


def curves(histories: dict[str, list[tuple[float, int, float]]], metric: str) -> Figure | None:
    """One line per run: `metric` at each epoch against seconds since the run began."""
    import plotly.graph_objects as go

    if not any(histories.values()):
        return None
    fig = go.Figure([go.Scatter(name=label, x=[p[0] for p in points], y=[p[2] for p in points],
                                mode="lines+markers", text=[f"epoch {p[1]}" for p in points])
                     for label, points in histories.items() if points])
    title = f"Learning curves: {metric} per epoch against time"
    _layout(fig, title, "time since the run began (s, wall clock)", f"{metric} (per epoch)")
    rows = [[label, str(epoch), f"{s:.1f}", cell(v)] for label, points in histories.items()
            for s, epoch, v in points]
    return Figure(title, fig, Table(["run", "epoch", "time (s)", metric], rows))


def best_so_far(points: list[tuple[float, int, float, float]], metric: str,
                target: float | None, reached: float | None) -> Figure | None:
    """The study's best value against study time, the target as a line and where it was
    reached. points: (seconds since the first trial began, trial, its value, best so far)."""
    import plotly.graph_objects as go

    if not points:
        return None
    xs = [p[0] for p in points]
    fig = go.Figure([
        go.Scatter(name="a trial's value", x=xs, y=[p[2] for p in points], mode="markers",
                   text=[f"trial {p[1]}" for p in points]),
        go.Scatter(name="best so far", x=xs, y=[p[3] for p in points], mode="lines",
                   line={"shape": "hv"})])
    if target is not None:
        fig.add_hline(y=target, line_dash="dash", annotation_text=f"target {cell(target)}")
    if reached is not None:
        fig.add_vline(x=reached, line_dash="dot", annotation_text=f"reached at {reached:.0f} s")
    title = f"Time to target: the study's best {metric} as its trials finished"
    _layout(fig, title, "time since the study's first trial began (s, wall clock)", metric)
    rows = [[f"{s:.1f}", str(n), cell(v), cell(b)] for s, n, v, b in points]
    return Figure(title, fig, Table(["finished at (s)", "trial", metric, "best so far"], rows))


def states(counts: dict[str, int]) -> Figure:
    """How many trials ended in each state."""
    import plotly.graph_objects as go

    names = list(counts)
    fig = go.Figure([go.Bar(x=names, y=[counts[n] for n in names],
                            text=[str(counts[n]) for n in names], textposition="auto")])
    title = "Trials by state"
    _layout(fig, title, "state", "trials (count)", height=320)
    return Figure(title, fig, Table(["state", "trials"], [[n, str(counts[n])] for n in names]))


def time_split(rows: list[tuple[str, dict[str, float]]],
               title: str = "Where the time went, run by run") -> Figure | None:
    """Stacked horizontal bars: where each run's time went, part by part."""
    import plotly.graph_objects as go

    parts = [p for p in dict.fromkeys(k for _, split in rows for k in split)]
    if not rows or not parts:
        return None
    labels = [label for label, _ in rows]
    fig = go.Figure([go.Bar(name=p, y=labels, x=[split.get(p, math.nan) for _, split in rows],
                            orientation="h") for p in parts])
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    _layout(fig, title, "time (s, wall clock)", "run",
            height=max(300, 22 * len(rows) + 180))
    table = Table(["run", *(f"{p} (s)" for p in parts)],
                  [[label, *(cell(split.get(p), 3) for p in parts)] for label, split in rows])
    return Figure(title, fig, table)


def bars_with_intervals(rows: list[tuple[str, float, float, float]], title: str, x: str,
                        head: list[str], reference: float | None = None) -> Figure | None:
    """Horizontal bars with error bars: (label, value, low, high) each, `head` naming the
    four columns of the table; NaN rows left out."""
    import plotly.graph_objects as go

    rows = [r for r in rows if not math.isnan(r[1])]
    if not rows:
        return None
    fig = go.Figure([go.Bar(y=[r[0] for r in rows], x=[r[1] for r in rows], orientation="h",
                            error_x={"type": "data", "symmetric": False,
                                     "array": [_gap(r[3], r[1]) for r in rows],
                                     "arrayminus": [_gap(r[1], r[2]) for r in rows]})])
    if reference is not None:
        fig.add_vline(x=reference, line_color="black")
    fig.update_yaxes(autorange="reversed")
    _layout(fig, title, x, height=max(300, 32 * len(rows) + 160))
    table = Table(head, [[r[0], cell(r[1], 3), cell(r[2], 3), cell(r[3], 3)] for r in rows])
    return Figure(title, fig, table)


def _gap(high: float, low: float) -> float:
    return 0.0 if math.isnan(high) or math.isnan(low) else max(high - low, 0.0)
