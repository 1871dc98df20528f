"""`accel ablate`: run the ablation into MLflow and print its table."""

from __future__ import annotations

import argparse
import sys

from accel.ablation.plan import parse_techniques
from accel.ablation.runs import run_ablation
from accel.config import Config


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
