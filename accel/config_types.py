"""Casting a config value (from YAML, a KEY=VALUE override or an MLflow param) to its field's
type, with a one-line error naming the key and the type expected."""

from __future__ import annotations

import types
import typing
from typing import Any

import yaml

from accel.errors import ConfigError


def _base_type(tp: Any) -> tuple[Any, bool]:
    """`int | None` -> (int, True); `float` -> (float, False)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Cast `value` (from YAML, an override string or an MLflow param) to the field type."""
    base, optional = _base_type(tp)
    text = value.strip().lower() if isinstance(value, str) else None
    # "none" is null only where null is allowed: `search.pruner=none` is the string.
    if value is None or text in {"null", "~"} or (optional and text == "none"):
        if optional:
            return None
        raise ConfigError(f"{key}=None: a value is required ({_type_name(base)})")
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError
        if base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value) if not isinstance(value, str) else int(value.strip())
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is str:
            if isinstance(value, dict | list):
                raise ValueError
            return str(value)
        if typing.get_origin(base) in (dict, list) or base in (dict, list):
            kind = typing.get_origin(base) or base
            parsed = yaml.safe_load(value) if isinstance(value, str) else value
            if not isinstance(parsed, kind):
                raise ValueError
            return parsed
    except (TypeError, ValueError, yaml.YAMLError):
        raise ConfigError(
            f"{key}={value!r}: expected {_type_name(base)}{' or null' if optional else ''}"
        ) from None
    return value


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is dict or tp is dict:
        return "a mapping"
    if typing.get_origin(tp) is list or tp is list:
        return "a list"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, str(tp)
    )
