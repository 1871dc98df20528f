"""A study's page, second half: what its trials show. Parameter importances, parallel
coordinates, the Pareto front, the top trials' learning curves, time to target, how the trials
ended, and where the time went."""

from __future__ import annotations

from accel.report import figures
from accel.report import records as rec
from accel.report.page import Section, Table, cell
from accel.report.study import StudyFacts
from accel.tune import study_record as record

TOP = 5  # trials whose learning curves are drawn


def importances(f: StudyFacts) -> Section:
    s = Section("importances", "Parameter importances")
    fig = figures.importances(f.study, f.names)
    if fig is None:
        s.text.append("Importances need at least two complete trials and a searched parameter.")
    else:
        s.text.append("How much of each objective's variation over the complete trials goes "
                      "with each searched parameter. A guide to where the search mattered, "
                      "not a causal effect.")
        s.figures.append(fig)
    return s


def parallel(f: StudyFacts) -> Section:
    s = Section("parallel", "Parallel coordinates")
    fig = figures.parallel(f.study, f.names, f.complete)
    if fig is None:
        s.text.append("No complete trial to draw.")
    else:
        s.figures.append(fig)
    return s


def pareto_front(f: StudyFacts) -> Section:
    s = Section("pareto", "Pareto front")
    fig = figures.pareto(f.study, f.names, f.front, f.run_id)
    if fig is None:
        s.text.append("Optuna draws fronts of 2 or 3 objectives; the front is listed under "
                      "the answer.")
    else:
        s.text.append("The complete trials no other complete trial beats on every objective "
                      "at once.")
        s.figures.append(fig)
    return s


def top_trials(f: StudyFacts) -> list:
    if f.multi:
        return f.front[:TOP]
    up = f.directions[0] == "maximize"
    return sorted(f.complete, key=lambda t: t.value, reverse=up)[:TOP]


def curves(f: StudyFacts) -> Section:
    metric = rec.curve_metric(f.names)
    s = Section("curves", "Learning curves of the top trials")
    histories = {}
    for t in top_trials(f):
        run = f.runs.get(t.number)
        if run is not None:
            histories[f"trial {t.number}"] = rec.history(f.tracker, run, metric)
    fig = figures.curves(histories, metric)
    if fig is None:
        s.text.append(f"No {metric} was logged per epoch by the top trials.")
    else:
        s.text.append(f"The {'front' if f.multi else f'top {len(histories)}'} trial(s): "
                      f"{metric} after each epoch, against the wall-clock time of the run "
                      "(training, evaluation and logging).")
        s.figures.append(fig)
    return s


def _target(f: StudyFacts) -> tuple[float | None, str]:
    """The value to reach on the first objective: the config's train.target where it names
    that metric, else the study's best value."""
    import yaml

    text = rec.artifact_text(f.tracker, f.parent.info.run_id, "config.yaml") if f.parent \
        else None
    try:
        target = ((yaml.safe_load(text) or {}).get("train") or {}).get("target") if text else None
    except yaml.YAMLError:
        target = None
    if isinstance(target, dict) and target.get("metric") == f.names[0]:
        return float(target["value"]), "the config's train.target"
    values = [t.values[0] for t in f.complete]
    if not values:
        return None, ""
    best = max(values) if f.directions[0] == "maximize" else min(values)
    return best, "the study's best value (the config sets no train.target for it)"


def time_to_target(f: StudyFacts) -> Section:
    s = Section("target", "Time to target")
    done = sorted((t for t in f.complete if t.datetime_complete),
                  key=lambda t: t.datetime_complete)
    starts = [t.datetime_start for t in f.study.trials if t.datetime_start]
    target, why = _target(f)
    if not done or not starts or target is None:
        s.text.append("No complete trial yet.")
        return s
    up = f.directions[0] == "maximize"
    first, points, best, reached = min(starts), [], None, None
    for t in done:
        v = t.values[0]
        best = v if best is None or (v > best if up else v < best) else best
        seconds = (t.datetime_complete - first).total_seconds()
        points.append((seconds, t.number, v, best))
        if reached is None and (best >= target if up else best <= target):
            reached = seconds
    s.facts += [("target", f"{f.names[0]} {'>=' if up else '<='} {cell(target, 6)} ({why})"),
                ("reached", f"{reached:.1f} s after the study's first trial began"
                 if reached is not None else "not reached")]
    s.figures.append(figures.best_so_far(points, f.names[0], target, reached))
    return s


def _retry_of(trials) -> dict[int, object]:
    """Failed trial number -> the trial that retried it (Optuna's retry_history ends with the
    attempt it retries)."""
    out = {}
    for t in trials:
        history = t.system_attrs.get("retry_history") or []
        if history:
            out[history[-1]] = t
    return out


def states(f: StudyFacts) -> Section:
    trials = f.study.get_trials(deepcopy=False)
    names = [t.state.name for t in trials]
    counts = {"complete": names.count("COMPLETE"), "pruned": names.count("PRUNED"),
              "failed": names.count("FAIL"),
              "retried": len(record.retried(trials))}
    for extra in ("RUNNING", "WAITING"):
        if extra in names:
            counts[extra.lower()] = names.count(extra)
    s = Section("states", "How the trials ended")
    s.text.append("Pruned: stopped early by the pruner. Failed: ended by an error, or by a "
                  "worker that died or was stopped; retried: failed trials queued again with "
                  "the same values (a retry carries on from the last checkpoint).")
    s.figures.append(figures.states(counts))
    retry_of, rows = _retry_of(trials), []
    for t in trials:
        if t.state.name != "FAIL":
            continue
        run = f.runs.get(t.number)
        error = t.user_attrs.get(record.ATTR_ERROR) or (run.data.tags.get(record.ATTR_ERROR)
                                                    if run else None) or "no error recorded"
        retry = retry_of.get(t.number)
        became = (f"retried as trial {retry.number} ({retry.state.name.lower()})" if retry
                  else "not retried" + (": its own error would recur"
                                        if record.ATTR_ERROR in t.user_attrs else ""))
        rows.append([str(t.number), error, became, f.run_id(t) or ""])
    if rows:
        s.tables.append(Table(["trial", "error", "what became of it", "MLflow run"], rows,
                              "The failed trials"))
    return s


def _label(t) -> str:
    return f"trial {t.number} ({t.state.name.lower()})"


def where_time_went(f: StudyFacts) -> Section:
    s = Section("time", "Where the time went")
    with_runs = [(t, f.runs[t.number]) for t in f.study.trials if t.number in f.runs]
    walls = [w for _, r in with_runs if (w := rec.wall_s(r)) is not None]
    starts = [t.datetime_start for t in f.study.trials if t.datetime_start]
    ends = [t.datetime_complete for t in f.study.trials if t.datetime_complete]
    if starts and ends:
        s.facts.append(("study", f"{(max(ends) - min(starts)).total_seconds():.1f} s from the "
                                 f"first trial's start to the last trial's end"))
    s.facts.append(("trials", f"{sum(walls):.1f} s of trial runs in all ({len(walls)} runs)"))
    logged = rec.split_logged(r for _, r in with_runs)
    s.text.append("Each run's MFU and time split (the last epoch), as the runs logged them."
                  if logged else
                  "The runs logged no MFU or time split: each run's wall time is split into "
                  "its training epochs (train_time_s) and the rest (set-up, evaluation, test "
                  "split, logging).")
    fig = figures.time_split([(_label(t), rec.time_parts(r)) for t, r in with_runs])
    if fig is not None:
        s.figures.append(fig)
    speed = [[_label(t), "; ".join(rec.speed_facts(r)) or "not logged"] for t, r in with_runs]
    if speed:
        s.tables.append(Table(["run", "speed (MFU, FLOP/s, throughput where logged)"], speed))
    return s


def sections(f: StudyFacts) -> list[Section]:
    out = [importances(f), parallel(f)]
    if f.multi:
        out.append(pareto_front(f))
    return [*out, curves(f), time_to_target(f), states(f), where_time_went(f)]
