"""Where each combination's time went: the paper's question asked of the user's machine. Each
technique attacks one share of an epoch (pinned memory the copy, AMP the compute, accumulation
the memory that limits the batch); this table says which share each combination moved against
the baseline, in seconds of a steady epoch (the median over the repeats of each run's median
over its steady epochs), and its MFU."""

from __future__ import annotations

import math
import statistics
from typing import Protocol

from accel.ablation.plan import Combination
from accel.ablation.record import RunRecord
from accel.console import fmt
from accel.timing import PARTS


class Row(Protocol):
    """What this table reads of a row of the ablation (accel.ablation.report.Row)."""

    combo: Combination

    @property
    def ok(self) -> list[RunRecord]: ...


def part_s(row: Row, key: str) -> float:
    values = [r.split[key] for r in row.ok if key in r.split]
    return statistics.median(values) if values else math.nan


def moved(row: Row, baseline: Row) -> str:
    """The part whose seconds changed most against the baseline's, with the change."""
    changes = {p: part_s(row, f"time_{p}_s") - part_s(baseline, f"time_{p}_s") for p in PARTS}
    changes = {p: c for p, c in changes.items() if not math.isnan(c)}
    if row is baseline or not changes:
        return ""
    part = max(changes, key=lambda p: abs(changes[p]))
    before = part_s(baseline, f"time_{part}_s")
    share = f" ({100 * changes[part] / before:+.0f}%)" if before > 0 else ""
    return f"{part} {changes[part]:+.3g} s{share}"


def split_table(rows: list[Row]) -> str:
    """The markdown table, or "" where no run measured its split."""
    if not any(r.split for row in rows for r in row.ok):
        return ""
    head = ["combination", *(f"{p} s" for p in PARTS), "MFU", "moved most"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [fmt(part_s(row, f"time_{p}_s"), 3) for p in PARTS]
        lines.append("| " + " | ".join([row.combo.name, *cells, fmt(part_s(row, "mfu"), 3),
                                        moved(row, rows[0])]) + " |")
    return ("Where a steady epoch's time went (seconds, median over repeats; accel.timing), "
            "and which part each combination moved against the baseline:\n\n"
            + "\n".join(lines) + "\n")
