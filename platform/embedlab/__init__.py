"""embedlab: train text-embedding encoders and run controlled ablations on Ray."""

from embedlab.core.code_identity import VERSION as __version__
from embedlab.core.config import Budget

__all__ = ["Budget", "Search", "Stage", "Study", "Tour", "load_table", "recipes", "__version__"]

# The public API of study files and notebooks, imported on first use (PEP 562), not with the
# package: importing any embedlab module imports this file first, and `Study` and `load_table`
# bring the declarations and statistics with pandas and scipy to processes that need neither (a
# Train worker, `embedlab --help`). A name maps to its module and attribute; `recipes` is a module.
_LAZY = {
    "Search": ("embedlab.studies.study", "Search"),
    "Stage": ("embedlab.studies.tour", "Stage"),
    "Study": ("embedlab.studies.study", "Study"),
    "Tour": ("embedlab.studies.tour", "Tour"),
    "load_table": ("embedlab.stats.table", "load_table"),
    "recipes": ("embedlab.studies.recipes", None),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'embedlab' has no attribute {name!r}")
    import importlib

    module, attribute = _LAZY[name]
    value = importlib.import_module(module)
    value = value if attribute is None else getattr(value, attribute)
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
