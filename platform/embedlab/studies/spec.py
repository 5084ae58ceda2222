"""Data specs for `embedlab data ...`: a study file, a TOML/JSON data config, or the defaults.

A TOML spec holds DataConfig fields at top level, e.g.

    sources = ["python-docs", "python-docstrings", "fortunes"]
    sequence_length = 128
    [mixture]
    shares = [["python-docs", 0.2], ["python-docstrings", 0.3], ["fortunes", 0.5]]
    max_epochs = 4
"""

from __future__ import annotations

from embedlab.core import paths
from embedlab.core.config import ConfigError, DataConfig, build_config, read_mapping_file
from embedlab.studies.study import load_study


def load_data_configs(spec: str | None) -> list[DataConfig]:
    """The distinct data configs a spec names (a study's arms may share one)."""
    if spec is None:
        return [DataConfig()]
    path = paths.require_file(spec, "data spec")
    if path.suffix == ".py":
        configs: list[DataConfig] = []
        for arm in load_study(path).arms.values():
            if arm.data not in configs:
                configs.append(arm.data)
        return configs
    if path.suffix not in (".toml", ".json"):
        raise ConfigError(f"{path}: unsupported spec type {path.suffix!r}; use .py, .toml or .json")
    raw = read_mapping_file(path)
    try:
        return [build_config(DataConfig, raw, "data")]
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
