"""Warm starts: a study that begins from configurations already known to be good.

- `accel tune --enqueue RUN_ID ...`: the searched values of logged runs (any accel run of the
  store) become the next trials;
- `search.enqueue:` in the experiment file: partial configs tried first, when the study is made;
- `accel tune --from-study OTHER [--from-storage URL]`: the finished trials of an earlier study
  over a compatible space are copied in as prior knowledge (Optuna `add_trials`): the sampler
  learns from them without training them again.

Values outside the space and keys that are not in it are refused (exit 2, naming them).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from accel.config import Config, ConfigError, objectives, set_key
from accel.tracking import retry_locked
from accel.tune import pareto
from accel.tune.space import Dim, get_key
from accel.tune.storage import is_journal
from accel.tune.study_record import ATTR_COPIED, ATTR_RUN

ATTR_ENQUEUED = "accel.enqueued_from"  # trial user attr: the run or file entry it came from


def _inside(dim: Dim, value: Any) -> bool:
    if dim.type == "categorical":
        return value in dim.choices
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and dim.low <= value <= dim.high)


def _checked(dims: list[Dim], values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values` restricted to what the space would suggest (conditions included), or a
    ConfigError naming `where` and the key."""
    by_key = {d.key: d for d in dims}
    for key in values:
        if key not in by_key:
            raise ConfigError(f"{where}: {key} is not a key of the search space; its keys: "
                              f"{', '.join(by_key)}")
    params: dict[str, Any] = {}
    for dim in dims:  # in suggestion order: a condition's keys come first
        if dim.key not in values or not dim.applies(params):
            continue
        if not _inside(dim, values[dim.key]):
            raise ConfigError(f"{where}: {dim.key}={values[dim.key]!r} is outside the search "
                              f"space ({dim.as_dict()})")
        params[dim.key] = values[dim.key]
    return params


def run_values(cfg: Config, dims: list[Dim], tracker, run_ids: list[str]) -> list[tuple]:
    """(run id, the searched values it logged) per run, checked against the space."""
    out = []
    for run_id in run_ids:
        try:
            run = retry_locked(tracker.client.get_run, run_id)
        except Exception:
            raise ConfigError(f"--enqueue {run_id}: no such run in the MLflow store") from None
        values = {}
        for dim in dims:
            text = run.data.params.get(dim.key)
            if text is None:
                continue
            typed = copy.deepcopy(cfg)
            try:
                set_key(typed, dim.key, text)
            except ConfigError as e:
                raise ConfigError(f"--enqueue {run_id}: {e}") from None
            values[dim.key] = get_key(typed, dim.key)
        if not values:
            raise ConfigError(f"--enqueue {run_id}: the run logged none of the searched keys "
                              f"({', '.join(d.key for d in dims)}); is it an accel run?")
        out.append((run_id, _checked(dims, values, f"--enqueue {run_id}")))
    return out


def enqueue_runs(study, queued: list[tuple]) -> None:
    """Queue each run's values (`run_values`) as the next trials."""
    for run_id, params in queued:
        study.enqueue_trial(params, user_attrs={ATTR_ENQUEUED: run_id})


def check_file_enqueue(cfg: Config, dims: list[Dim]) -> list[dict[str, Any]]:
    """`search.enqueue`, checked against the space before anything runs."""
    entries = cfg.search.enqueue
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(f"search.enqueue[{i}]={entry!r}: expected a mapping of space keys "
                              "to values, e.g. {train.lr: 0.001}")
        out.append(_checked(dims, entry, f"search.enqueue[{i}]"))
    return out


def enqueue_file_entries(study, cfg: Config, dims: list[Dim]) -> None:
    for i, params in enumerate(check_file_enqueue(cfg, dims)):
        study.enqueue_trial(params, user_attrs={ATTR_ENQUEUED: f"search.enqueue[{i}]"})


def trials_of(cfg: Config, dims: list[Dim], other_name: str, other_storage) -> list:
    """The COMPLETE trials of study `other_name` as new trials of this space, after checking
    that both studies have the same objectives and that every value is inside this space."""
    import optuna

    try:
        other = optuna.load_study(study_name=other_name, storage=other_storage)
    except KeyError:
        raise ConfigError(f"--from-study {other_name}: no such study in that storage") from None
    mine = [(m, d) for m, d in objectives(cfg.search)]
    theirs = [(n, d.name.lower()) for n, d in
              zip(pareto.objective_names(other), other.directions, strict=True)]
    if mine != theirs:
        raise ConfigError(f"--from-study {other_name}: its objectives {theirs} differ from "
                          f"this study's {mine}")
    by_key = {d.key: d for d in dims}
    out = []
    for t in other.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        params = _checked(dims, t.params, f"--from-study {other_name} trial {t.number}")
        attrs = {ATTR_COPIED: origin(other_name, t)}
        if ATTR_RUN in t.user_attrs:  # `accel best` and `accel reproduce` find its run
            attrs[ATTR_RUN] = t.user_attrs[ATTR_RUN]
        out.append(optuna.trial.create_trial(
            params=params, distributions={k: _distribution(by_key[k]) for k in params},
            values=t.values, user_attrs=attrs))
    return out


def check_not_itself(name: str, storage: str, other_name: str, other_storage: str) -> None:
    """A study copying itself would add each of its trials again as a copy, on every run."""
    if other_name == name and _same_storage(storage, other_storage):
        raise ConfigError(f"--from-study {other_name}: that is this study itself, whose finished "
                          "trials the sampler already learns from; name another study")


def _same_storage(a: str, b: str) -> bool:
    if is_journal(a) and is_journal(b):
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    return a == b


def origin(study_name: str, trial) -> str:
    """STUDY#N of the trial that trained: a copy of a copy names the first study, so the same
    trial reaching a study by two ways (or back where it came from) is added once."""
    return trial.user_attrs.get(ATTR_COPIED, f"{study_name}#{trial.number}")


def add_trials(study, trials: list) -> int:
    """Add the copied trials this study does not hold yet, as a copy or as its own; returns
    how many were added."""
    done = {origin(study.study_name, t) for t in study.get_trials(deepcopy=False)}
    new = [t for t in trials if t.user_attrs[ATTR_COPIED] not in done]
    study.add_trials(new)
    return len(new)


def _distribution(dim: Dim):
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if dim.type == "categorical":
        return CategoricalDistribution(list(dim.choices))
    if dim.type == "int":
        return IntDistribution(int(dim.low), int(dim.high), log=dim.log, step=int(dim.step or 1))
    return FloatDistribution(dim.low, dim.high, log=dim.log, step=dim.step)
