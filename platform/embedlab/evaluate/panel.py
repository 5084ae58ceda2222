"""Score one model on several retrieval tasks together: per-task metrics and their mean.

`score_panel(score_one, tasks, metric)` calls `score_one(task)` once per task, in the order
given. Every number it returns (ints and floats, not bools) becomes a panel column
``<task name>/<key>``, unchanged; anything else (ids, per-query dictionaries) is dropped. For
each requested metric, ``mean/<metric>`` is the *unweighted* mean of the tasks' values:
``math.fsum(values) / len(tasks)``. Every task counts once whatever its number of queries, so
a small task moves the mean as much as a large one (the BEIR/MTEB convention for an average
score); a NaN in one task makes the mean NaN.

`score_one` is any single-task scorer whose keys name the split, as the sweep's columns do
(``dev/ndcg@10``): `split_scorer` turns an evaluator that takes (task, split) into one, and
`checkpoint_scorer` does so for `evaluate_checkpoint`.

A study metric over a panel is ``<task>/<metric>`` or ``mean/<metric>``, for example
``scifact/dev/ndcg@10`` or ``mean/dev/ndcg@10``; `resolve_study_metric` checks such a name
before anything runs. So that a name splits one way only, task names in a panel may not
contain "/" and may not be "mean".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedlab.core.beir import Task
from embedlab.core.config.tasks import MEAN, PanelError, check_task_names
from embedlab.core.errors import UnknownKey
from embedlab.tasks.metrics import METRIC_NAMES

# The metrics a study may optimise on its main task (`sweep.study.Study.metric`), and the
# per-task metrics a panel's study metric may name.
METRICS = ("dev/ndcg@10", "dev/recall@100", "dev/mrr@10", "dev/map")
# What `split_scorer` keeps of an evaluator's result, under `<split>/`: the sweep's columns.
SPLIT_KEYS = (*METRIC_NAMES, "queries", "docs")

Scorer = Callable[[Task], Mapping[str, Any]]


class UnknownPanelMetric(UnknownKey):
    """A study metric that names no task of the panel, or no metric."""


@dataclass(frozen=True)
class PanelMetric:
    """A resolved study metric: `task` None for the mean over tasks; `key` is its panel column."""

    task: str | None
    metric: str

    @property
    def key(self) -> str:
        return f"{self.task if self.task is not None else MEAN}/{self.metric}"


def score_panel(score_one: Scorer, tasks: Sequence[Task], metric: str | Sequence[str]) -> dict[str, float]:
    """Per-task columns ``<task>/<key>`` of every number `score_one` returns, plus ``mean/<m>``
    for each metric `m` in `metric` (one name or several), the unweighted mean over tasks.

    Raises PanelError when there are no tasks, names repeat, contain "/" or are "mean", or
    a task's scores lack a requested metric or hold something other than a number for it.
    """
    names = check_task_names(task.name for task in tasks)
    return panel_columns(((name, score_one(task)) for name, task in zip(names, tasks)), metric)


def panel_columns(scored: Iterable[tuple[str, Mapping[str, Any]]], metric: str | Sequence[str]) -> dict[str, float]:
    """`score_panel`'s columns from scores already computed: (task name, scores) in panel order."""
    scored = list(scored)
    names = check_task_names(name for name, _ in scored)
    wanted = [metric] if isinstance(metric, str) else list(metric)
    if not wanted:
        raise PanelError("score_panel needs at least one metric to average")
    columns: dict[str, float] = {}
    per_metric: dict[str, list[float]] = {m: [] for m in wanted}
    for name, (_, scores) in zip(names, scored):
        numbers = {key: value for key, value in scores.items() if _is_number(value)}
        for m in wanted:
            if m not in numbers:
                reported = ", ".join(sorted(numbers)) or "(no numbers)"
                raise PanelError(f"task {name!r}: the scorer reported no number {m!r}; it reported: {reported}")
            per_metric[m].append(numbers[m])
        columns.update({f"{name}/{key}": value for key, value in numbers.items()})
    for m, values in per_metric.items():
        columns[f"{MEAN}/{m}"] = math.fsum(values) / len(values)
    return columns


def panel_metric_names(task_names: Iterable[str], metrics: Sequence[str] = METRICS) -> tuple[str, ...]:
    """Every valid study metric of a panel: the means first, then each task's, in task order."""
    names = check_task_names(task_names)
    return (*(f"{MEAN}/{m}" for m in metrics), *(f"{t}/{m}" for t in names for m in metrics))


def resolve_study_metric(name: str, task_names: Iterable[str], metrics: Sequence[str] = METRICS) -> PanelMetric:
    """`name` ("<task>/<metric>" or "mean/<metric>") as a PanelMetric; `metrics` are the
    per-task metrics a study may optimise (default: `METRICS`).

    Raises UnknownPanelMetric (a KeyError and a UserError) listing every valid name.
    """
    names = check_task_names(task_names)
    prefix, _, metric = name.partition("/")
    if metric in metrics and (prefix == MEAN or prefix in names):
        return PanelMetric(task=None if prefix == MEAN else prefix, metric=metric)
    raise UnknownPanelMetric(
        f"study metric {name!r} is not a metric of this panel (tasks: {', '.join(names)}); valid names: "
        + ", ".join(panel_metric_names(names, metrics))
    )


def split_scorer(evaluate: Callable[[Task, str], Mapping[str, Any]], split: str) -> Scorer:
    """A `score_one` from `evaluate(task, split)`: its `SPLIT_KEYS` and numeric ``health/...``
    values, as ``<split>/<key>`` (the sweep's row columns). Retention scores are left out:
    they measure the model, not the task, and would repeat once per task."""

    def score_one(task: Task) -> dict[str, Any]:
        return split_columns(evaluate(task, split), split)

    return score_one


def split_columns(scores: Mapping[str, Any], split: str) -> dict[str, Any]:
    """An evaluator's `SPLIT_KEYS` and numeric ``health/...`` values as ``<split>/<key>``."""
    return {f"{split}/{key}": value for key, value in scores.items()
            if (key in SPLIT_KEYS or key.startswith("health/")) and _is_number(value)}


def checkpoint_scorer(checkpoint_dir: str | Path, split: str, **options: Any) -> Scorer:
    """`split_scorer` over `evaluate_checkpoint(checkpoint_dir, task, split, **options)`; the
    checkpoint is loaded again for each task (`options` must not include `retention_dir`)."""
    if "retention_dir" in options:
        raise PanelError("checkpoint_scorer: score the retention panel once, outside the task panel")

    def evaluate(task: Task, split_name: str) -> Mapping[str, Any]:
        from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint  # imports torch

        return evaluate_checkpoint(checkpoint_dir, task, split_name, **options)

    return split_scorer(evaluate, split)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
