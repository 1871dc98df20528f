"""The MLflow side of a tuning study: its one parent run, the trials' child runs, and what the
parent run shows (best value and trial, trials.csv, Optuna's plots).

Names are part of the contract (DESIGN.md): experiment = study name; the parent run has tags
`accel.role=study` and `accel.study`; each trial run is its child, named `trial-NNN`, with tags
`accel.role=trial`, `optuna.trial_number` and `optuna.trial_state`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from accel.config import Config
from accel.console import note
from accel.errors import one_line
from accel.tracking import Tracker, retry_locked
from accel.tune import pareto
from accel.uris import redact

if TYPE_CHECKING:  # Optuna's and MLflow's types only: importing them here would slow the CLI
    from mlflow.entities import Run
    from optuna import Study
    from optuna.trial import FrozenTrial, TrialState

# A finished trial's Optuna state gives its MLflow run this status.
RUN_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}
PLOTS = ("optimization_history", "param_importances", "parallel_coordinate")
# Drawing the plots takes seconds on a CPU (PNG rendering): after a trial they are redrawn when
# this process last drew them PLOT_EVERY_S ago; the end of every `accel tune` always redraws them.
PLOT_EVERY_S = 60.0
# Trial user attrs: its MLflow run, its error, and who runs it (the invocation, host and pid).
ATTR_RUN, ATTR_ERROR = "mlflow_run_id", "accel.error"
ATTR_STOPPED = "accel.stopped"  # a trial stopped by Ctrl-C or SIGTERM (its run ends KILLED)
ATTR_INVOCATION, ATTR_HOST, ATTR_PID = "accel.invocation", "accel.host", "accel.pid"
ATTR_PARENT = "accel.parent_run_id"  # the study user attr that names its parent run
ATTR_COPIED = "accel.copied_from"  # a trial copied from another study (`--from-study`): STUDY#N
MAX_TAG_CHARS = 500  # a tag or a trial attr keeps this much of an error
VERIFY_ROLE = "verify"  # `accel verify`'s run (accel.verify), which `accel best` reads


def search_runs(tracker: Tracker, study: str, filters: str) -> list[Run]:
    """Runs of `study` matching `filters` (MLflow filter syntax), oldest first."""
    exp = retry_locked(tracker.client.get_experiment_by_name, study)
    if exp is None:
        return []
    return retry_locked(tracker.client.search_runs, [exp.experiment_id],
                        f"tags.`accel.study` = '{study}' AND {filters}",
                        order_by=["attributes.start_time ASC"])


def parent_runs(tracker: Tracker, study: str) -> list[str]:
    """The study's parent runs, earliest first (ties broken by run id: every node agrees)."""
    runs = search_runs(tracker, study, "tags.`accel.role` = 'study'")
    return [r.info.run_id for r in sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))]


def find_trial_run(tracker: Tracker, study: str, number: int) -> str | None:
    """The run of trial `number` (the newest, should there be several), or None."""
    runs = search_runs(tracker, study, f"tags.`accel.role` = 'trial' AND "
                                       f"tags.`optuna.trial_number` = '{number}'")
    return runs[-1].info.run_id if runs else None


def ensure_parent_run(tracker: Tracker, study: Study, cfg: Config, storage_url: str) -> str:
    """The study's one parent run: found again on resume, created once otherwise (by the node
    that created the study; `prepare` makes other nodes wait until the study is set up)."""
    run_id = study.user_attrs.get(ATTR_PARENT)
    if run_id and run_id not in parent_runs(tracker, study.study_name):
        run_id = None  # someone deleted it, or this is another MLflow store
    if run_id is None:
        found = parent_runs(tracker, study.study_name)
        run_id = found[0] if found else _create_parent(tracker, study.study_name, cfg,
                                                       storage_url)
        # Two invocations starting together may both create one: the earliest wins.
        winner = parent_runs(tracker, study.study_name)[0]
        if winner != run_id:
            retry_locked(tracker.client.delete_run, run_id)
            run_id = winner
        study.set_user_attr(ATTR_PARENT, run_id)
    retry_locked(tracker.client.update_run, run_id, status="RUNNING")
    return run_id


def _create_parent(tracker: Tracker, name: str, cfg: Config, storage_url: str) -> str:
    s = cfg.search
    run_id = retry_locked(tracker.start_run, name, f"study-{name}", tags={
        "accel.role": "study", "accel.study": name, "optuna.storage": redact(storage_url),
        "optuna.sampler": s.sampler, "optuna.pruner": s.pruner, "search.metric": s.metric,
        "search.direction": s.direction,
    })
    retry_locked(tracker.log_config, run_id, cfg)
    return run_id


def trial_run_name(number: int) -> str:
    return f"trial-{number:03d}"


def trial_tags(study: str, number: int, invocation: str) -> dict[str, str]:
    return {"accel.role": "trial", "accel.study": study, "optuna.trial_number": str(number),
            "optuna.trial_state": "RUNNING", "accel.invocation": invocation}


def close_trial_run(tracker: Tracker, study: str, number: int, state: str, error: str | None = None,
                    *, run_id: str | None = None, interrupted: bool = False,
                    open_run: Callable[[], str] | None = None) -> str | None:
    """Give a finished trial's MLflow run its final tag and status, so every trial has exactly
    one run: `open_run` makes it when the trial failed before `train()` opened one."""
    run_id = run_id or find_trial_run(tracker, study, number)
    if run_id is None:
        if open_run is None:
            return None
        run_id = open_run()
    tags = {"optuna.trial_state": state}
    if error:
        tags[ATTR_ERROR] = error[:MAX_TAG_CHARS]
    retry_locked(tracker.set_tags, run_id, tags)
    status = "KILLED" if interrupted else RUN_STATUS[state]
    if retry_locked(tracker.client.get_run, run_id).info.status != status:
        retry_locked(tracker.end_run, run_id, status)
    return run_id


def close_dead_trial(tracker: Tracker, study: Study, trial: FrozenTrial, message: str, *,
                     interrupted: bool) -> str | None:
    """Close the MLflow run of a trial whose process is gone (or was interrupted). A trial that
    died before `train()` opened its run gets one here, with its searched values as params, so
    every trial has exactly one run."""
    def open_run() -> str:
        run_id = retry_locked(
            tracker.start_run, study.study_name, trial_run_name(trial.number),
            tags=trial_tags(study.study_name, trial.number,
                            trial.user_attrs.get(ATTR_INVOCATION, "")),
            parent_run_id=study.user_attrs.get(ATTR_PARENT))
        retry_locked(tracker.log_params, run_id, trial.params)
        return run_id

    return close_trial_run(tracker, study.study_name, trial.number, "FAIL", message,
                           run_id=trial.user_attrs.get(ATTR_RUN), interrupted=interrupted,
                           open_run=open_run)


def retried(trials: list[FrozenTrial]) -> set[int]:
    """The trials already queued again. Optuna's retry keeps the first attempt's number in
    `failed_trial` (a retry of a retry too); `retry_history` lists every attempt retried."""
    return {n for t in trials for n in t.system_attrs.get("retry_history", ())}


def close_left_running(tracker: Tracker, study: Study) -> list[int]:
    """Close the trial runs left RUNNING after their trial finished, and give a failed trial
    that has no run one: its close was tried while the store was away, or its process died
    between Optuna failing it and its run being made (every invocation and `accel best` look
    again). Returns the trials."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    closed, with_run = [], set()
    for run in search_runs(tracker, study.study_name, "tags.`accel.role` = 'trial'"):
        number = run.data.tags.get("optuna.trial_number", "")
        trial = trials.get(int(number)) if number.isdigit() else None
        with_run.add(trial.number if trial else None)
        if run.info.status != "RUNNING" or trial is None or not trial.state.is_finished():
            continue  # it is closed, still running (another worker's), or not this study's trial
        error = None if trial.state.name == "COMPLETE" else trial.user_attrs.get(ATTR_ERROR) or (
            "its run was left RUNNING when the trial ended (the store was away); closed later")
        close_trial_run(tracker, study.study_name, trial.number, trial.state.name, error,
                        run_id=run.info.run_id,
                        interrupted=bool(trial.user_attrs.get(ATTR_STOPPED)))
        closed.append(trial.number)
    for trial in trials.values():
        if (trial.state.name == "FAIL" and trial.number not in with_run
                and ATTR_RUN not in trial.user_attrs and ATTR_COPIED not in trial.user_attrs):
            close_dead_trial(tracker, study, trial, trial.user_attrs.get(ATTR_ERROR) or
                             "its process ended before its run was made",
                             interrupted=bool(trial.user_attrs.get(ATTR_STOPPED)))
            closed.append(trial.number)
    return sorted(closed)


# --- `accel verify`'s record, as `accel best` reads it -----------------------------------------


def latest_verification(tracker: Tracker, study: str) -> Run | None:
    """The study's last verification that finished, or None."""
    runs = search_runs(tracker, study, f"tags.`accel.role` = '{VERIFY_ROLE}' AND "
                                       "attributes.status = 'FINISHED'")
    return runs[-1] if runs else None


def verified_lines(tracker: Tracker, run: Run) -> list[str]:
    """What `accel best` adds when the study was verified (`run`): the table and the verdict."""
    table = retry_locked(tracker.client.download_artifacts, run.info.run_id, "verify.md")
    with open(table) as f:
        text = f.read().strip()
    return [f"verified over seeds {run.data.tags.get('accel.verify.seeds', '?')} "
            f"(accel verify, run {run.info.run_id}):", text]


# --- what the study's parent run shows ---------------------------------------------------------


def best_trial(study: Study) -> FrozenTrial | None:
    """The best COMPLETE trial, or None while there is none (and in a multi-objective study,
    which has a front instead: `pareto.front`)."""
    if pareto.is_multi(study):
        return None
    try:
        return study.best_trial
    except ValueError:
        return None


def update_parent(tracker: Tracker, study: Study, run_id: str, *, plots: bool) -> None:
    """best_value / best_trial, trial counts, trials.csv and (when asked) Optuna's plots."""
    trials = study.get_trials(deepcopy=False)
    counts = {s: sum(t.state.name == s for t in trials) for s in ("COMPLETE", "PRUNED", "FAIL")}
    metrics = {"n_complete": counts["COMPLETE"], "n_pruned": counts["PRUNED"],
               "n_failed": counts["FAIL"]}
    front = pareto.front(study) if pareto.is_multi(study) else []
    if front:
        metrics.update({"n_pareto": len(front), **pareto.best_values(study, front)})
        log_front(tracker, study, front, run_id)
    best = best_trial(study)
    if best is not None:
        metrics["best_value"] = best.value
        retry_locked(tracker.set_tags, run_id, {
            "best_trial": best.number, "best_run_id": best.user_attrs.get(ATTR_RUN, ""),
        })
        retry_locked(tracker.log_text, run_id, json.dumps(best.params, indent=2),
                     "best_params.json")
    finished = sum(counts.values())
    retry_locked(tracker.log_metrics, run_id, metrics, step=finished)
    retry_locked(tracker.log_text, run_id, trials_csv(study), "trials.csv")
    if plots and (best is not None or front):
        log_plots(tracker, study, run_id)


_pareto_tags: dict[str, str] = {}  # run id -> its accel.pareto tag, as this process set it


def log_front(tracker: Tracker, study: Study, front: list[FrozenTrial], run_id: str) -> None:
    """pareto.csv on the parent run; `accel.pareto=true` on the front's trial runs, `false` on
    the other complete trials' (a trial leaves the front when a later one dominates it)."""
    run_of = lambda t: t.user_attrs.get(ATTR_RUN)  # noqa: E731
    retry_locked(tracker.log_text, run_id, pareto.pareto_csv(study, front, run_of), "pareto.csv")
    on_front = {t.number for t in front}
    for t in study.get_trials(deepcopy=False, states=complete_states()):
        trial_run, tag = run_of(t), str(t.number in on_front).lower()
        if ATTR_COPIED in t.user_attrs:  # its run belongs to the other study: left as it is
            continue
        if trial_run and _pareto_tags.get(trial_run) != tag:
            retry_locked(tracker.set_tags, trial_run, {"accel.pareto": tag})
            _pareto_tags[trial_run] = tag


def trials_csv(study: Study) -> str:
    """One row per trial: number, state, value, times, searched values and user attrs."""
    frame = study.trials_dataframe(attrs=("number", "state", "value", "datetime_start",
                                          "datetime_complete", "duration", "params",
                                          "user_attrs"))
    return frame.to_csv(index=False)


def log_plots(tracker: Tracker, study: Study, run_id: str) -> None:
    """Optuna's history, importances and parallel coordinates, as interactive HTML and PNG."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization as html_plots
    import optuna.visualization.matplotlib as png_plots

    complete = len(study.get_trials(deepcopy=False, states=complete_states()))
    multi = pareto.is_multi(study)
    names = ("pareto_front", "parallel_coordinate") if multi else PLOTS
    for name in names:
        if name == "param_importances" and complete < 2:
            continue  # Optuna needs two complete trials for importances
        if multi and name == "pareto_front" and len(study.directions) > 3:
            continue  # Optuna draws fronts of 2 or 3 objectives only
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna calls its matplotlib API experimental
                options = {"target_names": pareto.objective_names(study)} if multi else {}
                if multi and name == "parallel_coordinate":  # coloured by the first objective
                    options = {"target": lambda t: t.values[0],
                               "target_name": pareto.objective_names(study)[0]}
                figure = getattr(html_plots, f"plot_{name}")(study, **options)
                # Inline plotly.js (~4 MB): the UI shows the plot without a network.
                retry_locked(tracker.log_text, run_id,
                             figure.to_html(include_plotlyjs=True, full_html=True),
                             f"plots/{name}.html")
                axes = getattr(png_plots, f"plot_{name}")(study, **options)
                fig = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
                fig.set_size_inches(10, 6)
                retry_locked(tracker.log_figure, run_id, fig, f"plots/{name}.png")
                plt.close(fig)
        except Exception as e:  # a plot is only a view: the study goes on without it
            note(f"note: skipped plot {name}: {one_line(e)}")


def complete_states() -> tuple[TrialState, ...]:
    """The states of a trial with a value (a tuple, for `get_trials(states=...)`)."""
    from optuna.trial import TrialState

    return (TrialState.COMPLETE,)
