"""`accel reproduce RUN_ID`: rebuild a run's config from what MLflow logged, rerun it, compare.

The config comes from the run's `config.yaml` artifact, or, where that is gone (a store copied
without its artifacts, a deleted file), from the logged params cast back through the config
schema. Each rerun is a new run in the same experiment, tagged `accel.reproduces=<RUN_ID>`
(in a copied store whose experiment folder is not on this machine: a sibling experiment, below).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from accel import config
from accel.config import Config, ConfigError
from accel.config_params import from_params
from accel.console import fmt, note, warn
from accel.tracking.environment import environment, environment_diff
from accel.tracking.store import (
    fetch_run,
    local_artifact_dir,
    open_store,
    read_artifact,
    rerun_experiment,
)
from accel.uris import resolve_uri

TABLE_METRICS = ("val_accuracy", "val_f1", "val_loss", "test_accuracy", "train_updates")
AMP_PARAMS = {"bfloat16": "bf16", "float16": "fp16", "off": "off"}  # resolved.amp -> train.amp
TIME_METRIC = "epoch_time_s"
EXIT_NOT_REPRODUCED = 3


@dataclass
class Original:
    """What MLflow holds about the run to reproduce."""

    run_id: str
    experiment: str
    rerun_experiment: str  # the same experiment, unless its artifact folder is not here
    status: str
    config: Config
    source: str  # "config.yaml" or "params"
    metrics: dict[str, float]  # final (latest-step) values
    epoch_time_s: float | None  # median over the logged epochs
    environment: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)  # warnings to print before training
    replay: Any = None  # accel.train.Replay: what the run decided on its machine


# --- what MLflow holds about the run -------------------------------------------------------


def load_original(tracker, run_id: str) -> Original:
    import yaml

    run = fetch_run(tracker, run_id)
    experiment = tracker.client.get_experiment(run.info.experiment_id)
    local_dir, where = local_artifact_dir(tracker, run, experiment)
    target, moved = rerun_experiment(experiment)
    notes = [n for n in (where, moved) if n]

    text = read_artifact(tracker, run, local_dir, "config.yaml")
    if text is not None:
        try:
            cfg = config.from_dict(yaml.safe_load(text) or {})
        except ConfigError as e:
            raise ConfigError(f"config.yaml of run {run_id}: {e}") from None
        source = "config.yaml"
    else:
        cfg, params_notes = from_params(run.data.params)
        notes += [
            f"run {run_id} has no readable config.yaml; config rebuilt from its logged params",
            *params_notes,
        ]
        source = "params"

    replay, decided = decisions(tracker, run, local_dir, cfg)
    notes += decided
    env_text = read_artifact(tracker, run, local_dir, "environment.json")
    if env_text is None:
        notes.append("no environment.json for this run: the environment cannot be compared")
    if run.info.status != "FINISHED":
        notes.append(
            f"the run's status is {run.info.status} (pruned or stopped early); the "
            f"rerun trains all {cfg.train.epochs} epochs, so its numbers can differ"
        )

    return Original(
        run_id=run.info.run_id,
        experiment=experiment.name,
        rerun_experiment=target,
        status=run.info.status,
        config=cfg,
        source=source,
        metrics=dict(run.data.metrics),
        epoch_time_s=_median_epoch_time(tracker, run.info.run_id),
        environment=json.loads(env_text) if env_text else None,
        notes=notes,
        replay=replay,
    )


def decisions(tracker, run, local_dir, cfg: Config):
    """(accel.train.Replay, notes): what the run decided on its machine, to be decided the same
    in a rerun: the precision train.amp=auto chose (where the rerun's device is of the same
    kind), and a budgeted run's plan, replayed update by update instead of the budget."""
    from accel.engine import resolve_device
    from accel.train import Replay
    from accel.train.budget import ARTIFACT

    run_id, params, notes = run.info.run_id, run.data.params, []
    amp = AMP_PARAMS.get(params.get("resolved.amp", "")) if cfg.train.amp == "auto" else None
    kind = resolve_device(cfg.train.device).type
    if amp is not None and not params.get("resolved.device", "").startswith(kind):
        amp = None  # chosen for another kind of device: decided here again
    if amp is not None:
        notes.append(f"train.amp=auto chose {amp} in run {run_id}: the rerun trains in {amp}")
    revisions = None
    if cfg.train.budget_s:
        text = read_artifact(tracker, run, local_dir, ARTIFACT)
        if text is None:
            notes.append(f"run {run_id} has no {ARTIFACT}: the rerun trains to its own "
                         f"budget of {cfg.train.budget_s:g} s, so its numbers can differ")
        else:
            plan = json.loads(text)
            revisions = plan["revisions"]
            notes.append(f"train.budget_s={cfg.train.budget_s:g}: the rerun replays run "
                         f"{run_id}'s plan, {plan['updates']} updates in {plan['epochs']} "
                         "epochs, without reading the clock")
    return Replay(amp, revisions), notes


def _median_epoch_time(tracker, run_id: str) -> float | None:
    history = tracker.client.get_metric_history(run_id, TIME_METRIC)
    return statistics.median(m.value for m in history) if history else None


# --- the environment ------------------------------------------------------------------------


def check_environment(original: Original) -> list[str]:
    """Every difference between where the run ran and this machine, one line each."""
    from accel.engine import resolve_device

    if original.environment is None:
        return []
    device = resolve_device(original.config.train.device)
    return environment_diff(
        original.environment, environment(str(device), original.config.train.seed)
    )


# --- rerunning and comparing ----------------------------------------------------------------


@dataclass
class Rerun:
    seed: int
    run_id: str | None
    metrics: dict[str, float]
    epoch_time_s: float
    scores: dict[str, float] = field(default_factory=dict)  # study objectives (`scores`)


# --- what is compared -------------------------------------------------------------------------


def held_to(cfg: Config) -> list[str]:
    """The metrics the rerun is compared on: a multi-objective study's objectives, else
    search.metric."""
    return [m for m, _ in config.objectives(cfg.search)]


def scores(tracker, run_id: str, cfg: Config) -> dict[str, float]:
    """A run's objective values as its study scored them (accel.tune.objective): validation
    metrics at the best epoch by search.metric, costs over the whole run; read from the
    per-epoch metrics it logged, so a run stopped before its summary is scored too."""
    from accel.train import find_best_epoch
    from accel.train.run_log import run_costs

    s = cfg.search
    names = {*held_to(cfg), s.metric, "epoch_time_s", "train_throughput", "peak_memory_mb"}
    curves = {n: {m.step: m.value for m in tracker.client.get_metric_history(run_id, n)}
              for n in names}
    steps = sorted(set.intersection(*(set(c) for c in curves.values())))
    if not steps:
        raise ConfigError(f"run {run_id} logged no epoch with all of {', '.join(sorted(names))}"
                          ": nothing to compare against")
    rows = [{n: curves[n][step] for n in names} for step in steps]
    best, costs = rows[find_best_epoch(rows, s.metric, s.direction) - 1], run_costs(rows)
    return {m: costs[m] if m in config.COST_METRICS else best[m] for m in held_to(cfg)}


def point_at(cfg: Config, uri: str, experiment: str) -> None:
    """Log into the store we read from (not the one logged months ago) and `experiment`.

    Keys are changed only where they would resolve elsewhere, so that a rerun in the original
    store logs exactly the original params.
    """
    if resolve_uri(cfg.tracking.uri) != uri:
        cfg.tracking.uri = uri
    if (cfg.tracking.experiment or cfg.name) != experiment:
        cfg.tracking.experiment = experiment


def rerun(original: Original, tracker, seeds: list[int]) -> list[Rerun]:
    """Train the rebuilt config once per seed, each as a new run beside the original."""
    import copy

    from accel.train import train

    out = []
    for i, seed in enumerate(seeds):
        cfg = copy.deepcopy(original.config)
        cfg.train.seed = seed  # also reseeds the train/val split and the DataLoader order
        point_at(cfg, tracker.uri, original.rerun_experiment)
        note(f"rerun {i + 1}/{len(seeds)} of {original.run_id} with train.seed={seed}")
        result = train(
            cfg,
            run_name=f"reproduce-{original.run_id[:8]}-seed{seed}",
            tags={
                "accel.role": "reproduce",
                "accel.reproduces": original.run_id,
                "accel.config_source": original.source,
            },
            replay=original.replay,
        )
        times = [row[TIME_METRIC] for row in result.history]
        scored = scores(tracker, result.run_id, cfg) if cfg.search.objectives else {}
        out.append(Rerun(seed, result.run_id, result.metrics, statistics.median(times), scored))
    return out


def table(original: Original, reruns: list[Rerun], metric: str,
          scored: dict[str, float] | None = None) -> str:
    """Original vs the logged-seed rerun, and mean / std / range over all seeds. `scored`, the
    original's objective values (a multi-objective study), puts them first."""
    first, k = reruns[0], len(reruns)
    head = ["metric", "original", f"rerun seed {first.seed}", "diff"]
    if k > 1:
        head += [f"mean ({k} seeds)", "std", "min", "max"]
    rows = [head]
    rows += [_row(f"{name} *", orig, [r.scores[name] for r in reruns])
             for name, orig in (scored or {}).items()]
    names = [m for m in TABLE_METRICS if m in original.metrics or m == metric]
    if metric not in names:
        names.insert(0, metric)
    for name in names:
        label = name + (" *" if name == metric and not scored else "")
        rows.append(_row(label, original.metrics.get(name), [r.metrics.get(name) for r in reruns]))
    rows.append(_row(f"{TIME_METRIC} (median)", original.epoch_time_s,
                     [r.epoch_time_s for r in reruns]))
    rows = [row for row in rows if row]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    seeds = ", ".join(str(r.seed) for r in reruns)
    title = (
        f"run {original.run_id} ({original.experiment}, config from {original.source}) "
        f"vs rerun(s) with seed(s) {seeds}"
    )
    starred = ("the study's objectives as it scored them (validation metrics at the best "
               "epoch, costs over the whole run)" if scored else "the search metric")
    footer = (f"* {starred}; other seeds also change the train/val split; "
              "epoch time depends on the machine and its load")
    return "\n".join([title, *lines, footer])


def _row(label: str, orig: float | None, values: list[float | None]) -> list[str]:
    """One table row; none where a rerun lacks the metric."""
    if any(v is None for v in values):
        return []
    diff = values[0] - orig if orig is not None else None
    row = [label, fmt(orig), fmt(values[0]), fmt(diff, sign=True)]
    if len(values) > 1:  # spread over seeds: sample std and range
        row += [fmt(statistics.fmean(values)), fmt(statistics.stdev(values)),
                fmt(min(values)), fmt(max(values))]
    return row


def verdict(original: Original, reruns: list[Rerun], metric: str, tolerance: float,
            scored: dict[str, float] | None = None) -> tuple[bool, str]:
    """Reproduced when the held metrics are within `tolerance`: search.metric, or the study's
    objectives (`scored`) that are not costs; costs depend on the machine and its load, so
    they are reported, not held (a study of costs alone is held to search.metric)."""
    if not scored:
        return _verdict([_held(metric, original.metrics[metric], reruns[0].metrics[metric],
                               tolerance)])
    parts = [_held(m, v, reruns[0].scores[m], tolerance) for m, v in scored.items()
             if m not in config.COST_METRICS]
    if not parts:
        parts = [_held(metric, original.metrics[metric], reruns[0].metrics[metric], tolerance)]
    parts += [_cost(m, v, reruns[0].scores[m]) for m, v in scored.items()
              if m in config.COST_METRICS]
    return _verdict(parts)


def _held(name: str, orig: float, new: float, tolerance: float) -> tuple[bool, str]:
    diff = abs(new - orig)
    how = ("exactly" if diff == 0 else f"|diff| {diff:.3g} <= {tolerance:g}" if diff <= tolerance
           else f"|diff| {diff:.3g} > tolerance {tolerance:g}")
    return diff <= tolerance, f"{name} {new:.4f} vs {orig:.4f} ({how})"


def _cost(name: str, orig: float, new: float) -> tuple[bool, str]:
    change = f"{(new - orig) / orig:+.1%}" if orig else "n/a"
    return True, (f"{name} {new:.4g} vs {orig:.4g} ({change}; a cost: depends on the machine "
                  "and its load, not held to --tolerance)")


def _verdict(parts: list[tuple[bool, str]]) -> tuple[bool, str]:
    ok = all(good for good, _ in parts)
    return ok, ("reproduced: " if ok else "NOT reproduced: ") + "; ".join(t for _, t in parts)


def reproduce(
    run_id: str, *, seeds: int = 1, tolerance: float = 0.005, tracking_uri: str | None = None
) -> tuple[int, Original, list[Rerun]]:
    """The whole command without argparse: returns (exit code, original, reruns)."""
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: must be >= 1")
    if not tolerance >= 0:
        raise ConfigError(f"--tolerance {tolerance}: must be >= 0")
    tracker = open_store(tracking_uri)
    original = load_original(tracker, run_id)
    metric = original.config.search.metric
    scored = scores(tracker, run_id, original.config) if original.config.search.objectives \
        else None
    if metric not in original.metrics:
        raise ConfigError(
            f"run {run_id} logged no {metric} (search.metric): nothing to compare "
            f"against; it logged: {', '.join(sorted(original.metrics)) or 'nothing'}"
        )
    for line in original.notes:
        note(line)
    for line in check_environment(original):
        warn(line)

    base = original.config.train.seed
    reruns = rerun(original, tracker, [base + i for i in range(seeds)])
    print(table(original, reruns, metric, scored))
    print("reruns: " + ", ".join(str(r.run_id) for r in reruns))
    ok, line = verdict(original, reruns, metric, tolerance, scored)
    print(line)
    return (0 if ok else EXIT_NOT_REPRODUCED), original, reruns


def cli_reproduce(args) -> int:
    code, _, _ = reproduce(
        args.run_id, seeds=args.seeds, tolerance=args.tolerance, tracking_uri=args.tracking_uri
    )
    return code
