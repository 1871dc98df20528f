"""The paper's grid: one ablation per experiment file (its three models), under one MLflow parent
run (`accel.role=ablation-grid`), and one summary across them: per technique and model, the
speed-up and the accuracy difference of the technique alone against the all-off baseline, with
their intervals, and one line per technique: turn it on, leave it off, it depends on the model,
not applicable here, or no clear effect at this many repeats, and why."""

from __future__ import annotations

from dataclasses import dataclass

from accel.ablation.report import Ablation, Row, accuracy_cell
from accel.ablation.runs import check_input, run_ablation
from accel.config import Config
from accel.console import MISSING, progress

ROLE = "ablation-grid"


@dataclass
class Grid:
    names: list[str]  # one per experiment file: its config's name (model on data)
    ablations: list[Ablation]
    techniques: tuple[str, ...]
    parent_run_id: str | None = None

    def alone(self, technique: str) -> list[Row]:
        """Per experiment, the row of `technique` switched on alone."""
        return [next(r for r in a.rows if r.combo.on == frozenset({technique}))
                for a in self.ablations]

    def markdown(self) -> str:
        head = ["technique", *self.names, "verdict"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for t in self.techniques:
            cells = [_cell(row) for row in self.alone(t)]
            lines.append("| " + " | ".join([t, *cells, verdict(t, self)]) + " |")
        repeats = self.ablations[0].repeats if self.ablations else 0
        notes = [f"Each cell: the technique alone against the all-off baseline of that "
                 f"experiment: speed-up (steady s/epoch, baseline / technique) with its 95% "
                 f"Student-t interval over {repeats} repeat(s), each repeat its own seed; then "
                 "the validation-accuracy difference with its interval. A verdict needs an "
                 "interval that excludes no change."]
        return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n\n" + "\n".join(
            f"- **{t}**: {verdict(t, self)}" for t in self.techniques) + "\n"


def _cell(row: Row) -> str:
    if row.na:
        return row.status.split(" (same run")[0]
    speed, _ = row.intervals()
    med = row.speedup[0]
    if speed is None:
        return f"{med:.2f}x (one seed: no interval)" if row.speedups else MISSING
    return f"{speed.mean:.2f}x [{speed.low:.2f}, {speed.high:.2f}]; {accuracy_cell(row)}"


def verdict(technique: str, grid: Grid) -> str:
    """Turn on / leave off / not applicable here / no clear effect, and why, from the rows of
    the technique alone: no verdict from an interval that includes no change."""
    rows = dict(zip(grid.names, grid.alone(technique), strict=True))
    applicable = {n: r for n, r in rows.items() if not r.na and r.speedups}
    if not applicable:
        reasons = {r.status.split(" (same run")[0] for r in rows.values() if r.na}
        return f"not applicable here ({'; '.join(sorted(reasons)) or 'no run succeeded'})"
    if all(len(r.speedups) < 2 for r in applicable.values()):
        return "no verdict: one seed per combination gives no interval (use --repeats 3 or more)"
    ratio = {n: f"{n} {r.intervals()[0].mean:.2f}x" for n, r in applicable.items()}
    worse = [n for n, r in applicable.items() if r.more_accurate is False]
    if worse:
        return f"leave off: lower accuracy on {', '.join(worse)} (beyond noise)"
    faster = [ratio[n] for n, r in applicable.items() if r.faster]
    slower = [ratio[n] for n, r in applicable.items() if r.faster is False]
    unclear = [ratio[n] for n, r in applicable.items() if r.faster is None]
    if len(faster) == len(applicable):
        return (f"turn on: faster on every model ({', '.join(faster)}), no accuracy lost "
                "beyond noise")
    if slower and not faster:
        return (f"leave off: slower on {', '.join(slower)}"
                + (f"; within noise for {', '.join(unclear)}" if unclear else "")
                + "; faster on none")
    if faster and slower:
        return (f"depends on the model: turn on for {', '.join(faster)}; leave off for "
                f"{', '.join(slower)}" + (f"; within noise for {', '.join(unclear)}"
                                          if unclear else ""))
    return (f"no clear effect: within noise for {', '.join(unclear)}"
            + (f"; faster for {', '.join(faster)}" if faster else "")
            + "; more repeats would narrow the intervals")


def run_grid(cfgs: list[Config], techniques: tuple[str, ...], repeats: int, *,
             tracker) -> Grid:
    """Every file's input checked first (no run is made for a grid one of whose files is bad
    input), then one parent run and one ablation per file under it."""
    for cfg in cfgs:
        check_input(cfg, techniques, repeats)
    experiment = cfgs[0].tracking.experiment or "ablation-grid"
    names = [cfg.name for cfg in cfgs]
    grid = Grid(names, [], techniques)
    parent = tracker.start_run(experiment, f"grid {','.join(techniques)}: {', '.join(names)}",
                               tags={"accel.role": ROLE,
                                     "accel.ablation.techniques": ",".join(techniques),
                                     "accel.ablation.repeats": str(repeats)})
    grid.parent_run_id, status = parent, "FAILED"
    try:
        for i, cfg in enumerate(cfgs, 1):
            progress(f"== grid {i}/{len(cfgs)}: {cfg.name}")
            cfg.tracking.experiment = experiment
            grid.ablations.append(run_ablation(cfg, techniques, repeats, tracker=tracker,
                                               parent_run_id=parent))
        tracker.log_text(parent, grid.markdown(), "grid.md")
        status = "FINISHED" if all(a.baseline_ok for a in grid.ablations) else "FAILED"
        return grid
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.end_run(parent, status)

