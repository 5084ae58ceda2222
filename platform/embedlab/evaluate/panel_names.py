"""The rule for a panel's task names: each prefixes its task's columns (`embedlab.evaluate.panel`).

Kept apart from the scorer so `embedlab.config` can check `EvalConfig`'s names at construction
without importing it.
"""

from __future__ import annotations

from collections.abc import Iterable

from embedlab.errors import UserError

MEAN = "mean"


class PanelError(UserError, ValueError):
    """A panel cannot be scored: bad task names, or a metric some task did not report."""


def check_task_names(names: Iterable[str]) -> list[str]:
    """The names as a list, after checking they can prefix panel columns unambiguously."""
    names = list(names)
    if not names:
        raise PanelError("a panel needs at least one task")
    for name in names:
        if not name or "/" in name or name == MEAN:
            raise PanelError(f"task name {name!r} cannot name panel columns: it must be non-empty, without '/', "
                             f"and not {MEAN!r} (the mean's prefix)")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PanelError(f"task names repeat in the panel: {', '.join(repeated)}; each task's columns need their own prefix")
    return names
