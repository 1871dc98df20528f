"""The search space: the `search:` block of an experiment file, checked whole before any trial
starts, and what a trial's values make of the base config.

A study is defined by its metric, direction and space (`definition`): they are stored with the
study, and a resume that would change them is refused (`check_same_study`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from typing import Any

from accel.config import PRUNERS, SAMPLERS, Config, ConfigError, objectives, set_key, validate

__all__ = ["PRUNERS", "SAMPLERS", "Dim", "check_search", "definition", "trial_config"]
SPACE_TYPES = ("float", "int", "categorical")
SPEC_FIELDS = ("type", "low", "high", "log", "step", "choices", "when")
UNSEARCHABLE = ("search.", "tracking.")  # these define the study and where it is logged


@dataclass(frozen=True)
class Dim:
    """One searched config key: a float or int range, or a list of choices."""

    key: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()
    when: tuple = ()  # ((key, (allowed values...)), ...): searched only where all of them hold

    def applies(self, values: dict[str, Any]) -> bool:
        """Its condition holds for the values suggested so far (a key left out fails it)."""
        return all(key in values and values[key] in allowed for key, allowed in self.when)

    def suggest(self, trial) -> Any:
        if self.type == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return trial.suggest_int(self.key, self.low, self.high, log=self.log,
                                     step=self.step or 1)
        return trial.suggest_categorical(self.key, list(self.choices))

    def as_dict(self) -> dict[str, Any]:
        """The JSON form kept in the study, compared when a study is resumed."""
        if self.type == "categorical":
            out = {"type": "categorical", "choices": list(self.choices)}
        else:
            out = {"type": self.type, "low": self.low, "high": self.high, "log": self.log,
                   "step": self.step}
        if self.when:
            out["when"] = {key: list(allowed) for key, allowed in self.when}
        return out


def check_search(cfg: Config) -> list[Dim]:
    """The `search:` section, checked whole before any trial can start (ConfigError otherwise).
    Its metric, direction, sampler and pruner were checked with the config itself."""
    if cfg.search.n_trials < 1:
        raise ConfigError(f"search.n_trials={cfg.search.n_trials}: must be >= 1")
    return parse_space(cfg)


def parse_space(cfg: Config) -> list[Dim]:
    space = cfg.search.space
    if not space:
        raise ConfigError("search.space is empty: map config keys to ranges, e.g. "
                          "train.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}")
    dims = [_parse_dim(cfg, str(key), spec) for key, spec in space.items()]
    return _conditions_first(dims)


def _parse_when(where: str, spec: Any) -> tuple:
    if not isinstance(spec, dict) or not spec:
        raise ConfigError(f"{where}.when: expected a mapping of space keys to a value or a list "
                          f"of values, e.g. {{train.optimizer: sgd}}; got {spec!r}")
    return tuple((str(key), tuple(v if isinstance(v, list) else [v]))
                 for key, v in spec.items())


def _conditions_first(dims: list[Dim]) -> list[Dim]:
    """Check each `when:` against the space (its keys searched, its values possible there) and
    order the dims so that a condition's keys are suggested before the dim they decide."""
    by_key = {d.key: d for d in dims}
    for dim in dims:
        for key, allowed in dim.when:
            if key == dim.key or key not in by_key:
                raise ConfigError(f"search.space.{dim.key}.when: {key} is not another key of "
                                  f"the space; conditions can use: "
                                  f"{', '.join(k for k in by_key if k != dim.key) or 'none'}")
            for value in allowed:
                if not _possible(by_key[key], value):
                    raise ConfigError(f"search.space.{dim.key}.when: {key}={value!r} can never "
                                      f"be suggested ({_short(by_key[key].as_dict())})")
    ordered: list[Dim] = []
    while len(ordered) < len(dims):
        ready = [d for d in dims if d not in ordered
                 and all(by_key[k] in ordered for k, _ in d.when)]
        if not ready:
            cycle = ", ".join(d.key for d in dims if d not in ordered)
            raise ConfigError(f"search.space: the when: conditions of {cycle} depend on each "
                              "other in a cycle")
        ordered += ready
    return ordered


def _possible(dim: Dim, value: Any) -> bool:
    if dim.type == "categorical":
        return value in dim.choices
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and dim.low <= value <= dim.high)


def _parse_dim(cfg: Config, key: str, spec: Any) -> Dim:
    where = f"search.space.{key}"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping like {{type: float, low: 0.001, "
                          f"high: 0.1}}, got {spec!r}")
    unknown = sorted(set(spec) - set(SPEC_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown field {', '.join(map(str, unknown))}; "
                          f"allowed: {', '.join(SPEC_FIELDS)}")
    if key.startswith(UNSEARCHABLE):
        raise ConfigError(f"{where}: {key.split('.')[0]}.* keys define the study itself and "
                          "cannot be searched")
    kind = spec.get("type")
    if kind not in SPACE_TYPES:
        raise ConfigError(f"{where}.type={kind!r} is not one of: {', '.join(SPACE_TYPES)}")
    dim = _categorical(where, key, spec) if kind == "categorical" else _range(where, key, spec)
    for value in dim.choices if kind == "categorical" else (dim.low, dim.high):
        _check_value(cfg, where, dim, value)
    if "when" in spec:
        dim = dataclasses.replace(dim, when=_parse_when(where, spec["when"]))
    return dim


def _range(where: str, key: str, spec: dict[str, Any]) -> Dim:
    kind = spec["type"]
    if "choices" in spec:
        raise ConfigError(f"{where}: choices is for type: categorical, not {kind}")
    bounds = []
    for name in ("low", "high"):
        if name not in spec:
            raise ConfigError(f"{where}: {name} is required for type: {kind}")
        bounds.append(_number(f"{where}.{name}", spec[name], kind))
    low, high = bounds
    if low >= high:
        raise ConfigError(f"{where}: low={low} must be < high={high}")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log={log!r}: expected true or false")
    if log and low <= 0:
        raise ConfigError(f"{where}: log: true needs low > 0, got low={low}")
    step = spec.get("step")
    if step is not None:
        step = _number(f"{where}.step", step, kind)
        if step <= 0:
            raise ConfigError(f"{where}.step={step}: must be > 0")
        if log:
            raise ConfigError(f"{where}: step and log: true cannot be combined")
    return Dim(key, kind, low, high, log, step)


def _number(where: str, value: Any, kind: str) -> float | int:
    """A finite number; strings too, because YAML 1.1 reads `1e-4` (no dot) as a string."""
    try:
        if isinstance(value, bool):
            raise ValueError
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}={value!r}: expected a number") from None
    if not math.isfinite(x):
        raise ConfigError(f"{where}={value!r}: must be finite")
    if kind == "int":
        if not x.is_integer():
            raise ConfigError(f"{where}={value!r}: expected an integer for type: int")
        return int(x)
    return x


def _categorical(where: str, key: str, spec: dict[str, Any]) -> Dim:
    ranged = [f for f in ("low", "high", "log", "step") if f in spec]
    if ranged:
        raise ConfigError(f"{where}: {', '.join(ranged)} is for float/int ranges; "
                          "type: categorical takes choices")
    choices = spec.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ConfigError(f"{where}: choices must be a non-empty list, got {choices!r}")
    for c in choices:
        if c is not None and not isinstance(c, bool | int | float | str):
            raise ConfigError(f"{where}: choice {c!r} is not a single value "
                              "(null, a number, a string or true/false)")
    if len({json.dumps(c) for c in choices}) != len(choices):
        raise ConfigError(f"{where}: choices {choices!r} repeat a value")
    return Dim(key, "categorical", choices=tuple(choices))


def get_key(cfg: Config, key: str) -> Any:
    return functools.reduce(getattr, key.split("."), cfg)


def _check_value(cfg: Config, where: str, dim: Dim, value: Any) -> None:
    """Would the config accept `value` for `dim.key`? Checked on a copy, with the config's rules."""
    trial_cfg = copy.deepcopy(cfg)
    try:
        set_key(trial_cfg, dim.key, value)
        validate(trial_cfg)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    got = get_key(trial_cfg, dim.key)
    if dim.type != "categorical" and (isinstance(got, bool) or not isinstance(got, int | float)):
        raise ConfigError(f"{where}: {dim.key} is not a number; use type: categorical")
    if dim.type == "float" and isinstance(got, int):
        raise ConfigError(f"{where}: {dim.key} takes integers; use type: int")


def trial_config(cfg: Config, dims: list[Dim], trial) -> Config:
    """The base config with this trial's values set (a copy). A dim whose `when:` fails is not
    suggested at all (the trial has no such param) and the config keeps its value."""
    out, values = copy.deepcopy(cfg), {}
    for dim in dims:
        if dim.applies(values):
            values[dim.key] = dim.suggest(trial)
            set_key(out, dim.key, values[dim.key])
    validate(out)
    return out


def definition(cfg: Config, dims: list[Dim]) -> dict[str, Any]:
    """What makes trials of a study comparable; stored in the study's user attrs. A
    multi-objective study is defined by its objectives (metric and direction pick best.pt's
    epoch there)."""
    space = {d.key: d.as_dict() for d in dims}
    if cfg.search.objectives:
        return {"objectives": [list(o) for o in objectives(cfg.search)], "space": space,
                "data": study_data(cfg)}
    return {"metric": cfg.search.metric, "direction": cfg.search.direction, "space": space,
            "data": study_data(cfg)}


def study_data(cfg: Config) -> dict[str, Any]:
    """The data a study's trials train on: the dataset, the folder of an imagefolder (as the
    config writes it: two nodes give the same path), and a size set by the config."""
    d = cfg.data
    return {"dataset": d.dataset, "root": d.root if d.dataset == "imagefolder" else None,
            "train_limit": d.train_limit or None, "img_size": cfg.model.img_size}


def _data_text(data: dict[str, Any] | None) -> str:
    if not data:
        return "unknown"
    return " ".join(f"{k}={v}" for k, v in data.items() if v is not None)


def check_same_study(name: str, stored: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Refuse to resume a study with other objectives or another space: say what differs."""
    diffs = [f"search.{k} is {stored.get(k)}, this run asks for {wanted.get(k)}"
             for k in ("metric", "direction", "objectives") if stored.get(k) != wanted.get(k)]
    if "data" in stored and stored["data"] != wanted.get("data"):  # older studies kept none
        diffs.append(f"its trials trained on {_data_text(stored['data'])}, this run asks for "
                     f"{_data_text(wanted.get('data'))}")
    old, new = stored.get("space", {}), wanted["space"]
    for key in sorted(old.keys() | new.keys()):
        if key not in new:
            diffs.append(f"search.space.{key} is missing from this run")
        elif key not in old:
            diffs.append(f"search.space.{key} is new in this run")
        elif old[key] != new[key]:
            diffs.append(f"search.space.{key} was {_short(old[key])}, now {_short(new[key])}")
    if diffs:
        raise ConfigError(f"study '{name}' exists with another definition ({'; '.join(diffs)}): "
                          "use a new --study NAME, or the study's settings to resume it")


def _short(spec: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in spec.items() if v not in (None, False)})
