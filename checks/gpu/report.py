"""The whole check: setup, then each step within the budget, the report rewritten after each
one (a check cut short, or killed, still leaves OUT/gpu_check.md with what it had)."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from checks.gpu import machine, plan
from checks.gpu.runner import Row, run_step


def write(out: Path, rows: list[Row], provenance: list[str], wall: float,
          pending: tuple[str, ...] = ()) -> Path:
    """OUT/gpu_check.md: provenance, the steps' table, failures' last lines, each step's part."""
    cell = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["# GPU check", "", *provenance, f"- wall time: {wall:.0f} s", "",
             "| step | command | status | seconds | key numbers |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r.step} | `{cell(r.command)}` | {r.status} | {r.seconds:.1f} | "
              f"{cell(r.numbers)} |" for r in rows]
    lines += [f"| {name} | | pending | | |" for name in pending]
    for r in rows:
        if r.tail:
            lines += ["", f"## {r.step}: FAILED, last lines of {r.step}.log", "", "```",
                      *r.tail, "```"]
    for r in rows:
        if r.title:
            none = f"({r.numbers})" if r.status == "skipped" else "(no numbers: the step failed)"
            lines += ["", f"## {r.title}", "", r.section or none]
    path = out / "gpu_check.md"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def check(out: Path, dry: bool, only: tuple[str, ...] = ()) -> int:
    """Setup and the steps (or `only` these) within the budget; 1 if anything failed."""
    began = time.monotonic()
    deadline = began + (plan.DRY_BUDGET_S if dry else plan.BUDGET_S)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="accel-gpu-check-"))
    provenance = machine.provenance(dry)
    try:
        env = machine.child_env(work, dry)
        rows = [machine.setup(work, dry, out)]
        gpus = 0 if dry else machine.gpu_count()
        chosen = [s for s in plan.steps(sys.executable, dry, machine.data_root(work, dry), gpus)
                  if not only or s.name in only]
        for i, step in enumerate(chosen):
            write(out, rows, provenance, time.monotonic() - began,
                  tuple(s.name for s in chosen[i:]))
            rows.append(run_step(step, env, out, deadline))
            print(f"{step.name}: {rows[-1].status} in {rows[-1].seconds:.0f} s: {rows[-1].numbers}",
                  file=sys.stderr, flush=True)
        path = write(out, rows, provenance, time.monotonic() - began)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failed = [r.step for r in rows if r.status == "FAILED"]
    skipped = [r.step for r in rows if r.status == "skipped"]
    print(f"{path}: {sum(r.status == 'ok' for r in rows)} of {len(rows)} steps ok"
          + (f"; skipped: {', '.join(skipped)}" if skipped else "")
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
