"""embedlab: train text-embedding encoders and run controlled ablations on Ray."""

from embedlab.code_identity import VERSION as __version__
from embedlab.config import Budget

__all__ = ["Budget", "Search", "Study", "load_table", "__version__"]

# The public API is imported on first use (PEP 562), not with the package: importing any
# embedlab module imports this file first, and `Study` and `load_table` bring the sweep
# layer with pandas and scipy to processes that need neither (a Train worker, `embedlab --help`).
_LAZY = {"Search": "embedlab.sweep.study", "Study": "embedlab.sweep.study", "load_table": "embedlab.sweep.table"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'embedlab' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
