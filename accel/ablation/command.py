"""`accel ablate`: run the ablation (or, over several files, the grid) into MLflow and print its
tables, then where to see them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from accel.ablation.plan import parse_techniques
from accel.ablation.runs import run_ablation
from accel.config import Config

# Writes an ablation's page from its parent run (tracker, run id); the CLI passes accel.report's,
# which sits above this package.
AblationPage = Callable[[Any, str | None], None]


def cli_ablate(args: argparse.Namespace, cfg: Config, page: AblationPage | None = None) -> int:
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
    print(where(tracker, result.parent_run_id, ("ablation.md", "speedup.png")))
    if page is not None:  # its page: the table, intervals, time split
        page(tracker, result.parent_run_id)
    if not result.baseline_ok:
        print("accel: error: the all-off baseline failed in every repeat; no speed-up to report",
              file=sys.stderr)
        return 1
    return 0


def cli_grid(args: argparse.Namespace, cfgs: list[Config], page: AblationPage | None = None
             ) -> int:
    from accel.ablation.grid import run_grid
    from accel.tracking import Tracker

    techniques = parse_techniques(args.techniques)
    for cfg in cfgs:
        if args.tracking_uri:
            cfg.tracking.uri = args.tracking_uri
    tracker = Tracker(cfgs[0].tracking.uri)
    grid = run_grid(cfgs, techniques, args.repeats, tracker=tracker)
    for name, ablation in zip(grid.names, grid.ablations, strict=True):
        print(f"## {name}\n\n{ablation.markdown()}")
    print(f"## the grid\n\n{grid.markdown()}")
    print(f"MLflow: grid run {grid.parent_run_id}, one ablation run per file under it")
    print(where(tracker, grid.parent_run_id, ("grid.md",)))
    for ablation in grid.ablations if page is not None else ():  # each file's page
        page(tracker, ablation.parent_run_id)
    failed = [g for g, a in zip(grid.names, grid.ablations, strict=True) if not a.baseline_ok]
    if failed:
        print(f"accel: error: the all-off baseline failed in every repeat of "
              f"{', '.join(failed)}; no speed-up to report there", file=sys.stderr)
        return 1
    return 0


def where(tracker, run_id: str, artifacts: tuple[str, ...]) -> str:
    """The UI page of the run's experiment, and where its tables and figure are stored."""
    from accel.tracking.store import browse_hint, local_path

    run = tracker.client.get_run(run_id)
    folder = local_path(run.info.artifact_uri)
    base = str(folder) if folder is not None else run.info.artifact_uri
    stored = ", ".join(f"{base}/{name}" for name in artifacts)
    return f"browse: {browse_hint(tracker.uri, run.info.experiment_id)}\nartifacts: {stored}"
