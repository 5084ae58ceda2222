"""What every config module shares: the check that names a field, and the builder of a config
from plain JSON-like values (a run record, a TOML or JSON file)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from pathlib import Path
from typing import Any

from embedlab.core import paths
from embedlab.core.errors import ConfigError


# The largest integer a config field holds: float64 (every budget and schedule computes in it)
# holds each integer up to 2**53 exactly. Budgets and seeds have tighter maxima of their own.
MAX_INTEGER = 2**53
# A seed is an integer in [0, 2**32): numpy's seed range, which every seed here reaches.
SEED_LIMIT = 2**32


def check(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{field_name}: {message}")


def check_fields(config: object, section: str) -> None:
    """Every field of the dataclass `config` holds a value of its declared type, in the form
    the rest of embedlab computes with: an `int` field an integer (never a bool, a float or a
    string) of at most MAX_INTEGER in size, a `float` field a finite number (an integer is one;
    a bool, a string, inf and NaN are not), a `bool` field True or False, a `str` field a
    string, a config field a config of its class, a tuple field a tuple (or list) whose items
    are each of their type. Called first by every config's `__post_init__`, so a range check
    after it compares numbers, never a string with an int; the ConfigError names the field."""
    hints = _field_hints(type(config))
    for field in dataclasses.fields(config):
        problem = _type_problem(getattr(config, field.name), hints[field.name])
        if problem is not None:  # "[key]: ..." of a mapping's item reads as study.arms['b']: ...
            separator = "" if problem.startswith("[") else ": "
            raise ConfigError(f"{section}.{field.name}".lstrip(".") + separator + problem)


def check_seed(value: int, field_name: str) -> None:
    """A seed: an integer (`check_fields` made sure) in [0, SEED_LIMIT)."""
    check(0 <= value < SEED_LIMIT, field_name, f"{value}: a seed is an integer in [0, 2**32)")


@functools.cache
def _field_hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _type_problem(value: Any, hint: Any) -> str | None:
    """Why `value` is not of type `hint` ("must be an integer, got str '5'"), or None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        problems = [_type_problem(value, arg) for arg in args]
        if None in problems:
            return None
        return " or ".join(p.split(", got ")[0].removeprefix("must be ") for p in problems if p) \
            .join(("must be ", f", got {_shown(value)}"))
    if hint is type(None):
        return None if value is None else f"must be None, got {_shown(value)}"
    if hint is bool:
        return None if isinstance(value, bool) else f"must be True or False, got {_shown(value)}"
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, got {_shown(value)}"
        return None if abs(value) <= MAX_INTEGER else f"{value:.3g} is beyond the largest integer, 2**53"
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {_shown(value)}"
        return None if math.isfinite(value) else f"must be a finite number, got {value}"
    if hint is str:
        return None if isinstance(value, str) else f"must be a string, got {_shown(value)}"
    if dataclasses.is_dataclass(hint):
        return None if isinstance(value, hint) else f"must be a {hint.__name__}, got {_shown(value)}"
    if origin is tuple:
        if not isinstance(value, tuple | list):
            return f"must be a tuple, got {_shown(value)}"
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            return f"must hold {len(items)} items, got {len(value)}"
        for index, (item, item_hint) in enumerate(zip(value, items)):
            problem = _type_problem(item, item_hint)
            if problem is not None:
                return f"item {index}: {problem}"
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return f"must be a mapping, got {_shown(value)}"
        for key, item in value.items():
            problem = _type_problem(item, args[1]) if args else None
            if problem is not None:
                return f"[{key!r}]: {problem}"
    return None


def check_positive(config: object, section: str, *names: str) -> None:
    for name in names:
        check(getattr(config, name) > 0, f"{section}.{name}", "must be positive")


def build_config(kind: type, raw: dict[str, Any], section: str) -> Any:
    """A config dataclass `kind` from plain JSON-like values (`section` names it in errors); nested
    configs are built recursively, and unknown or missing keys are ConfigErrors that name them."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{section}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(kind)
    names = {f.name for f in dataclasses.fields(kind)}
    unknown = set(raw) - names
    if unknown:
        raise ConfigError(f"{section}: unknown keys {sorted(unknown)}; valid: {sorted(names)}")
    values = {}
    for key, value in raw.items():
        hint = hints[key]
        item_kind = _tuple_item_dataclass(hint)
        if dataclasses.is_dataclass(hint):
            values[key] = build_config(hint, value, f"{section}.{key}")
        elif item_kind is not None:
            values[key] = tuple(build_config(item_kind, v, f"{section}.{key}[{i}]") for i, v in enumerate(value))
        else:
            values[key] = _freeze(value)
    missing = sorted(f.name for f in dataclasses.fields(kind) if f.name not in values
                     and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    if missing:
        raise ConfigError(f"{section}: missing required keys {missing}")
    return kind(**values)


def read_mapping_file(path: str | Path) -> dict[str, Any]:
    """A TOML (.toml) or JSON (.json) file's top-level mapping; ConfigError naming the file otherwise."""
    import tomllib

    path = paths.require_file(path, "config file")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            raw = tomllib.loads(text)
        elif path.suffix == ".json":
            raw = json.loads(text)
        else:
            raise ConfigError(f"{path}: unsupported file type {path.suffix!r}; use .toml or .json")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at top level, got {type(raw).__name__}")
    return raw


def _tuple_item_dataclass(hint: Any) -> type | None:
    """X for a `tuple[X, ...]` hint whose X is a dataclass, else None."""
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis and dataclasses.is_dataclass(args[0]):
            return args[0]
    return None


def _freeze(value: Any) -> Any:
    """JSON lists back to the tuples the frozen configs hold."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
