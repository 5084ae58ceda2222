"""What every config module shares: the check that names a field, and the builder of a config
from plain JSON-like values (a run record, a TOML or JSON file)."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

from embedlab.core.errors import ConfigError


def check(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{field_name}: {message}")


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

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
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
