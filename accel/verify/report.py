"""What a verification shows: the table (terminal and verify.md), the verdict line, verify.csv
and verify.png. One objective: mean and interval per trial, shrinkage, probability of being best,
the winner against the file's own values. Several: an interval per objective and the
probability that each front member stays non-dominated."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import numpy as np

from accel.verify import stats
from accel.verify.runs import Candidate

ACCURACY_LIKE = ("accuracy", "f1")  # metrics in [0, 1], differences shown in percentage points


@dataclass
class Report:
    text: str
    table_md: str
    verdict: str
    csv: str
    best: int  # the trial a verification names: the best mean, or the front's most stable
    p_best: float


def _scale(metric: str) -> tuple[float, str, int]:
    """(factor, unit, decimals) to show a difference of `metric`."""
    return (100.0, " pp", 1) if any(w in metric for w in ACCURACY_LIKE) else (1.0, "", 4)


def _label(c: Candidate) -> str:
    return f"{c.number}" + (" (file's values)" if c.baseline else "")


def verdict(summary: stats.Summary, candidates: list[Candidate], metric: str) -> str:
    """One line: does the winner stay best, and does it beat the file's values beyond noise."""
    tuned_best = candidates[0].number  # `choose` lists the top trials first
    w = summary.winner
    number = summary.trials[w]
    group = stats.indistinct(summary)
    if group:
        names = ", ".join(str(summary.trials[i]) for i in [w, *group])
        first = f"trials {names} are not distinguishable"
    elif number == tuned_best:
        first = f"trial {number} stays best (p={summary.p_best[w]:.2f})"
    else:
        first = (f"trial {number} is best over seeds (p={summary.p_best[w]:.2f}), not trial "
                 f"{tuned_best} as tuned")
    base = next((i for i, c in enumerate(candidates) if c.baseline), None)
    if base is None:
        return f"{first}; the study has no complete baseline trial (the file's own values)"
    if base == w:
        return f"{first}; the file's own values (trial {number}) are the best"
    diff = stats.difference(summary, w, base)
    k, unit, d = _scale(metric)
    if diff.excludes(0.0) and diff.low > 0:
        return (f"{first}; beats the file's values by {k * diff.mean:+.{d}f}{unit} "
                f"[{k * diff.low:.{d}f}, {k * diff.high:.{d}f}]")
    subject = "none beats" if group else f"trial {number} does not beat"
    return f"{first}; {subject} the file's values beyond noise"


def _table(head: list[str], rows: list[list[str]]) -> tuple[list[str], str]:
    """Aligned text lines and a Markdown table of the same cells."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [head, *rows]]
    md = "\n".join("| " + " | ".join(r) + " |" for r in [head, ["---"] * len(head), *rows])
    return text, md


def single(study: str, metric: str, candidates: list[Candidate], seeds: list[int],
           values: np.ndarray, maximize: bool) -> Report:
    """values[t, s]: the one objective of trial t with seed s."""
    summary = stats.summarise([c.number for c in candidates], values, maximize)
    line = verdict(summary, candidates, metric)
    head = ["trial", "tuned", f"mean ({len(seeds)} seeds)", "95% interval", "shrinkage",
            "p(best)"]
    rows = []
    for c, ci, p in zip(candidates, summary.per_trial, summary.p_best, strict=True):
        shrinkage = round(c.values[0] - ci.mean, 4) + 0.0  # no "-0.0000"
        rows.append([_label(c), f"{c.values[0]:.4f}", f"{ci.mean:.4f}",
                     f"[{ci.low:.4f}, {ci.high:.4f}]", f"{shrinkage:+.4f}", f"{p:.2f}"])
    text, md = _table(head, rows)
    title = (f"study {study}: {metric}, {len(candidates)} trial(s) rerun with seeds "
             f"{', '.join(map(str, seeds))}; 95% Student-t intervals over seeds (differences "
             "paired by seed); shrinkage = tuned - mean")
    w = summary.winner
    caution = stats.few_seeds(len(seeds))
    title += f"; {caution}" if caution else ""
    return Report("\n".join([title, *text, line]), md + (f"\n\n{caution}" if caution else ""),
                  line,
                  to_csv(candidates, seeds, values[:, None, :], [metric]),
                  summary.trials[w], summary.p_best[w])


def front(study: str, objectives: list[tuple[str, str]], candidates: list[Candidate],
          seeds: list[int], values: np.ndarray) -> Report:
    """values[t, m, s]: objective m of trial t with seed s; the front's stability."""
    names = [name for name, _ in objectives]
    maximize = [d == "maximize" for _, d in objectives]
    per_objective = [stats.summarise([c.number for c in candidates], values[:, m, :], up)
                     for m, up in enumerate(maximize)]
    p_front = stats.front_probability(values, maximize)
    head = ["trial", *(f"{n}: tuned -> mean [95%]" for n in names), "p(non-dominated)"]
    rows = [[_label(c),
             *(f"{c.values[m]:.4g} -> {s.per_trial[t].mean:.4g} [{s.per_trial[t].low:.4g}, "
               f"{s.per_trial[t].high:.4g}]" for m, s in enumerate(per_objective)),
             f"{p_front[t]:.2f}"] for t, c in enumerate(candidates)]
    text, md = _table(head, rows)
    stable = [c.number for c, p in zip(candidates, p_front, strict=True) if p >= 0.5]
    shaky = [f"{c.number} (p={p:.2f})" for c, p in zip(candidates, p_front, strict=True)
             if p < 0.5]
    line = (f"stay on the front over seeds (p >= 0.5): trials {', '.join(map(str, stable))}"
            if stable else "no trial stays on the front in most resamples")
    line += f"; not reliably: {', '.join(shaky)}" if shaky else ""
    title = (f"study {study}: Pareto front over {', '.join(names)}, {len(candidates)} trial(s) "
             f"rerun with seeds {', '.join(map(str, seeds))}; 95% Student-t intervals over "
             "seeds; p(non-dominated) over seeds resampled together")
    best = int(np.argmax(p_front))
    caution = stats.few_seeds(len(seeds))
    title += f"; {caution}" if caution else ""
    return Report("\n".join([title, *text, line]), md + (f"\n\n{caution}" if caution else ""),
                  line,
                  to_csv(candidates, seeds, values, names), candidates[best].number,
                  p_front[best])


def to_csv(candidates: list[Candidate], seeds: list[int], values: np.ndarray,
           names: list[str]) -> str:
    """One row per rerun: trial, baseline, seed, then each objective's value and tuned value."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["trial", "baseline", "seed", *(f"{n}" for n in names),
                     *(f"tuned_{n}" for n in names)])
    for c, per_trial in zip(candidates, values, strict=True):
        for j, s in enumerate(seeds):
            writer.writerow([c.number, c.baseline, s, *(repr(float(v)) for v in per_trial[:, j]),
                             *(repr(v) for v in c.values)])
    return out.getvalue()


def figure(candidates: list[Candidate], values: np.ndarray, names: list[str]):
    """Per objective, per trial: the seeds' values, the mean with its interval, the tuned value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names),
                                                     0.6 * len(candidates) + 1.5), squeeze=False)
    for m, (ax, name) in enumerate(zip(axes[0], names, strict=True)):
        for y, c in enumerate(candidates):
            ci = stats.mean_interval(values[y, m])
            first = y == 0
            ax.scatter(values[y, m], [y] * values.shape[2], color="0.6", s=14,
                       label="a seed" if first else None)
            ax.errorbar([ci.mean], [y], xerr=[[ci.mean - ci.low], [ci.high - ci.mean]],
                        fmt="o", color="C0", capsize=4, label="mean, 95%" if first else None)
            ax.scatter([c.values[m]], [y], marker="x", color="C3", s=40,
                       label="tuned value" if first else None)
        ax.set_yticks(range(len(candidates)), [f"trial {_label(c)}" for c in candidates])
        ax.invert_yaxis()
        ax.set_xlabel(name)
    axes[0][0].legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig
