"""`accel verify --study S`: does the study's winner stay the winner? Its top trials and its
baseline rerun over the same fresh seeds; per trial the mean with a 95% interval beside the
tuning value (the shrinkage is the winner's curse, measured), the probability of being best, and
the winner against the file's own values."""

from __future__ import annotations

import csv
import io

import numpy as np

from accel.config import ConfigError
from accel.console import note, quiet_libraries
from accel.tracking import retry_locked, tracker_for
from accel.tune import tracking as st
from accel.tune.study import ATTR_DEFINITION, ATTR_TRACKING
from accel.uris import resolve_uri
from accel.verify import stats
from accel.verify.runs import (
    Candidate,
    Job,
    choose,
    close_running,
    finished_reruns,
    fresh_seeds,
    run_jobs,
    verification_run,
)

ACCURACY_LIKE = ("accuracy", "f1")  # metrics in [0, 1], shown in percentage points


def check_args(args) -> None:
    if args.top < 1:
        raise ConfigError(f"--top {args.top}: must be >= 1 (the number of best trials to rerun)")
    if args.seeds < 2:
        raise ConfigError(f"--seeds {args.seeds}: must be >= 2 (an interval needs at least two "
                          "seeds; 5 is the default)")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be >= 1")


def cli_verify(args) -> int:
    from accel.tune.commands import load_existing_study
    from accel.tune.pareto import is_multi

    check_args(args)
    quiet_libraries(study=True)
    study = load_existing_study(args.study, args.storage)
    if is_multi(study):
        raise ConfigError(f"study '{args.study}' has several objectives; accel verify takes a "
                          "single-objective study")
    metric = study.user_attrs.get(ATTR_DEFINITION, {}).get("metric", "value")
    uri = args.tracking_uri or study.user_attrs.get(ATTR_TRACKING) or resolve_uri(None)
    tracker = tracker_for(uri)
    candidates = _candidates(tracker, study, args.top)
    if not candidates:
        raise ConfigError(f"study '{args.study}' has no complete trial to verify")
    seeds = fresh_seeds(candidates, args.seeds)
    parent = study.user_attrs.get(st.ATTR_PARENT)
    run_id = verification_run(tracker, args.study, parent, {
        "top": args.top, "seeds": ",".join(map(str, seeds)), "metric": metric})
    status = "FAILED"
    try:
        values = _rerun_missing(tracker, args, candidates, seeds, run_id, metric, uri)
        summary = stats.summarise([c.number for c in candidates], values,
                                  study.direction.name == "MAXIMIZE")
        report = _report(args.study, metric, candidates, seeds, summary)
        print(report.text)
        _log(tracker, run_id, parent, report, summary, candidates)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        close_running(tracker, args.study, run_id)
        retry_locked(tracker.end_run, run_id, status)
    return 0


def _candidates(tracker, study, top: int) -> list[Candidate]:
    from accel.reproduce import load_original

    out = []
    for t in choose(study, top):
        run_id = t.user_attrs.get(st.ATTR_RUN) or st.find_trial_run(tracker, study.study_name,
                                                                     t.number)
        if run_id is None:
            raise ConfigError(f"trial {t.number} of study '{study.study_name}' has no MLflow "
                              "run in this store: pass the study's --tracking-uri")
        out.append(Candidate(t.number, run_id, t.value, bool(t.user_attrs.get(
            "accel.baseline")), load_original(tracker, run_id).config))
    return out


def _rerun_missing(tracker, args, candidates, seeds, run_id, metric, uri) -> np.ndarray:
    """Train the (trial, seed) pairs not done yet; the values, trials x seeds."""
    done = finished_reruns(tracker, args.study, run_id, metric)
    jobs = [Job(c, s, args.study, run_id, metric, uri) for c in candidates for s in seeds
            if (c.number, s) not in done]
    note(f"verify {args.study}: {len(candidates)} trial(s) x {len(seeds)} seed(s) "
         f"({', '.join(map(str, seeds))}); {len(done)} rerun(s) done before, {len(jobs)} to run")
    run_jobs(jobs, args.workers)
    done = finished_reruns(tracker, args.study, run_id, metric)
    return np.array([[done[(c.number, s)].value for s in seeds] for c in candidates])


# --- the report -------------------------------------------------------------------------------


class Report:
    def __init__(self, text: str, table_md: str, verdict: str, csv_text: str):
        self.text, self.table_md, self.verdict, self.csv = text, table_md, verdict, csv_text


def _scale(metric: str) -> tuple[float, str]:
    return (100.0, " pp") if any(w in metric for w in ACCURACY_LIKE) else (1.0, "")


def verdict(summary: stats.Summary, candidates: list[Candidate], tuned_best: int,
            metric: str) -> str:
    """One line: does the winner stay best, and does it beat the file's values beyond noise."""
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
    k, unit = _scale(metric)
    if diff.low > 0:
        return (f"{first}; beats the file's values by {k * diff.mean:+.{_digits(k)}f}{unit} "
                f"[{k * diff.low:.{_digits(k)}f}, {k * diff.high:.{_digits(k)}f}]")
    subject = "none beats" if group else f"trial {number} does not beat"
    return f"{first}; {subject} the file's values beyond noise"


def _digits(scale: float) -> int:
    return 1 if scale == 100.0 else 4


def _report(study: str, metric: str, candidates, seeds, summary: stats.Summary) -> Report:
    tuned_best = candidates[0].number  # `choose` lists the top trials first
    line = verdict(summary, candidates, tuned_best, metric)
    head = ["trial", "tuned", f"mean ({len(seeds)} seeds)", "95% interval", "shrinkage",
            "p(best)"]
    rows = []
    for c, ci, p in zip(candidates, summary.per_trial, summary.p_best, strict=True):
        label = f"{c.number}" + (" (file's values)" if c.baseline else "")
        shrinkage = round(c.value - ci.mean, 4) + 0.0  # no "-0.0000"
        rows.append([label, f"{c.value:.4f}", f"{ci.mean:.4f}",
                     f"[{ci.low:.4f}, {ci.high:.4f}]", f"{shrinkage:+.4f}", f"{p:.2f}"])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    text_rows = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                 for r in [head, *rows]]
    title = (f"study {study}: {metric}, {len(candidates)} trial(s) rerun with seeds "
             f"{', '.join(map(str, seeds))}; 95% paired bootstrap intervals over seeds; "
             "shrinkage = tuned - mean")
    md = "\n".join(["| " + " | ".join(r) + " |" for r in [head, ["---"] * len(head), *rows]])
    return Report("\n".join([title, *text_rows, line]), md, line,
                  _csv(candidates, seeds, summary))


def _csv(candidates, seeds, summary: stats.Summary) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["trial", "baseline", "seed", "value", "tuned_value"])
    for c, row in zip(candidates, summary.values, strict=True):
        for s, v in zip(seeds, row, strict=True):
            writer.writerow([c.number, c.baseline, s, repr(float(v)), repr(c.value)])
    return out.getvalue()


def _log(tracker, run_id: str, parent: str | None, report: Report, summary, candidates) -> None:
    retry_locked(tracker.log_text, run_id, report.csv, "verify.csv")
    retry_locked(tracker.log_text, run_id, f"{report.table_md}\n\n{report.verdict}\n",
                 "verify.md")
    retry_locked(tracker.log_figure, run_id, _figure(summary, candidates), "verify.png")
    w = summary.winner
    tags = {"accel.verified_best": summary.trials[w], "accel.p_best": f"{summary.p_best[w]:.3f}",
            "accel.verdict": report.verdict[:st.MAX_TAG_CHARS]}
    retry_locked(tracker.set_tags, run_id, tags)
    if parent:
        retry_locked(tracker.set_tags, parent, {**tags, "accel.verify_run": run_id})


def _figure(summary: stats.Summary, candidates):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 0.6 * len(candidates) + 1.5))
    for y, (c, ci, row) in enumerate(zip(candidates, summary.per_trial, summary.values,
                                         strict=True)):
        ax.scatter(row, [y] * len(row), color="0.6", s=14, label="a seed" if y == 0 else None)
        ax.errorbar([ci.mean], [y], xerr=[[ci.mean - ci.low], [ci.high - ci.mean]], fmt="o",
                    color="C0", capsize=4, label="mean, 95% interval" if y == 0 else None)
        ax.scatter([c.value], [y], marker="x", color="C3", s=40,
                   label="tuned value" if y == 0 else None)
    ax.set_yticks(range(len(candidates)),
                  [f"trial {c.number}" + (" (file)" if c.baseline else "") for c in candidates])
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig
