"""The inverse of `Config.flat()`: a config rebuilt from the params a run logged (all strings),
for `accel reproduce` on a store whose `config.yaml` is gone."""

from __future__ import annotations

import ast
from typing import Any

from accel.config import SPACE_KEY, Config, all_keys, set_key, validate
from accel.errors import ConfigError

# Params a run logs beside the config keys: derived values, not settings to rebuild.
DERIVED_PARAMS = ("effective_batch_size",)
DERIVED_PREFIXES = ("resolved.",)

def _literal(text: str) -> Any:
    """Invert `param_text`: None is "null", lists and bools are reprs, the rest stays text."""
    if text == "null":
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _space_from_params(items: dict[str, str]) -> dict[str, Any]:
    """Undo the flattening of `search.space` (`search.space.train.lr.low` -> {"train.lr": ...}).

    Space entries are named by dotted config keys, so the longest config key that prefixes a
    param names the entry and the rest is the path inside it.
    """
    keys = sorted(all_keys(), key=len, reverse=True)
    space: dict[str, Any] = {}
    for flat, text in items.items():
        rest = flat[len(SPACE_KEY) + 1 :]
        name = next((k for k in keys if rest == k or rest.startswith(k + ".")), None)
        path = [name, *rest[len(name) + 1 :].split(".")] if name else rest.split(".")
        path = [p for p in path if p]
        if len(path) > 2 and path[1] == "when":  # when: is keyed by dotted config keys too
            path = [*path[:2], ".".join(path[2:])]
        node = space
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = _literal(text)
    return space


def _mappings_from_params(settings: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Undo the flattening of the other mapping keys (`train.target.value` -> train.target):
    a param under a config key that is itself a setting belongs to that key's mapping."""
    keys = set(all_keys()) - {SPACE_KEY}
    out: dict[str, dict[str, Any]] = {}
    for flat, text in settings.items():
        owner = next((k for k in keys if flat.startswith(k + ".")), None)
        if owner is not None:
            out.setdefault(owner, {})[flat[len(owner) + 1:]] = _literal(text)
    return out


def from_params(params: dict[str, str]) -> tuple[Config, list[str]]:
    """Rebuild a config from its logged params (all strings): the inverse of `Config.flat()`
    as `param_text` logs it. Returns the config and notes on keys that did not fit the schema."""
    cfg, notes, unknown = Config(), [], []
    settings = {k: v for k, v in params.items()
                if k not in DERIVED_PARAMS and not k.startswith(DERIVED_PREFIXES)}
    space = {k: v for k, v in settings.items() if k.startswith(SPACE_KEY + ".")}
    mappings = _mappings_from_params(settings)  # e.g. train.target.metric -> train.target
    for key, value in settings.items():
        if key in space or any(key.startswith(m + ".") for m in mappings):
            continue
        try:
            set_key(cfg, key, value)
        except ConfigError as e:
            if not str(e).startswith("unknown config key"):
                raise ConfigError(f"logged param {key}={value!r} does not fit: {e}") from None
            unknown.append(key)
    if space:
        set_key(cfg, SPACE_KEY, _space_from_params(space))
    for key, mapping in mappings.items():
        set_key(cfg, key, mapping)
    missing = [k for k in all_keys()
               if k not in settings and k not in mappings and not (k == SPACE_KEY and space)]
    if unknown:
        notes.append(f"logged params unknown to this config schema, ignored: {', '.join(unknown)}")
    if missing:
        notes.append(f"config keys the run did not log, defaults used: {', '.join(missing)}")
    validate(cfg)
    return cfg, notes
