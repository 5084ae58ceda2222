"""A trial's evaluation as its row's columns: its scores on its task or panel, each query's
values (for paired tests across arms), and what the evaluations cost."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from embedlab.evaluate.panel import panel_columns, split_columns
from embedlab.tasks.metrics import METRIC_NAMES


def _eval_compute_columns(*results: dict[str, Any]) -> dict[str, float]:
    """The evaluations' cost as row columns (`evaluate_checkpoint`), summed over `results` (a
    panel's tasks); a cached result carries the cost of the evaluation that computed it."""
    return {f"compute/{key}": sum(scores[key] for scores in results)
            for key in ("eval_flops", "eval_seconds", "eval_wall_seconds")}


@dataclasses.dataclass(frozen=True)
class TrialScores:
    """A trial's scores on its task or panel (`score_trial`).

    `columns`: the row's score columns; `per_query`: each query's value of every metric the
    row averages, keyed as its column; `main`: the evaluator's result on the main task (its
    checkpoint and task hashes); `tasks`: the panel's task names, () without a panel;
    `task_hashes`: each panel task's content hash."""

    columns: dict[str, Any]
    per_query: dict[str, dict[str, float]]
    main: dict[str, Any]
    tasks: tuple[str, ...] = ()
    task_hashes: dict[str, str] = dataclasses.field(default_factory=dict)


def score_trial(evaluate: Callable[[str, str | None], dict[str, Any]], tasks: list[tuple[str, str]], split: str,
                retention_dir: str | None) -> TrialScores:
    """Score a checkpoint on `tasks` ((name, directory), main task first) through `evaluate(task
    directory, retention directory or None)`, an `evaluate_checkpoint`-shaped result.

    The main task is evaluated with the retention panel and fills the row's plain columns
    (`_score_columns`) as without a panel. With a panel, every task is evaluated once more
    (the main task's result is reused), without retention, and adds `panel.panel_columns` of its
    `panel.split_columns`: ``<task>/<split>/...`` and the unweighted ``mean/<split>/<metric>`` of
    each retrieval metric, ``<task>/eval/task_hash``, per-query values under ``<task>/<split>/...``,
    and the summed cost of every evaluation."""
    (_, main_dir), *extra = tasks
    main = evaluate(main_dir, retention_dir)
    per_query = {f"{split}/{metric}": values for metric, values in main["per_query"].items()}
    if not extra:
        return TrialScores({**_score_columns(main, split), **_eval_compute_columns(main)}, per_query, main)
    results = [(tasks[0][0], main), *((name, evaluate(directory, None)) for name, directory in extra)]
    columns = {
        **_score_columns(main, split),
        **panel_columns([(name, split_columns(scores, split)) for name, scores in results],
                        [f"{split}/{metric}" for metric in METRIC_NAMES]),
        **{f"{name}/eval/task_hash": scores["task_hash"] for name, scores in results},
        **_eval_compute_columns(*(scores for _, scores in results)),
    }
    for name, scores in results:
        per_query.update({f"{name}/{split}/{metric}": values for metric, values in scores["per_query"].items()})
    return TrialScores(columns, per_query, main, tuple(name for name, _ in results),
                       {name: scores["task_hash"] for name, scores in results})


def _score_columns(scores: dict[str, Any], split: str) -> dict[str, Any]:
    """An evaluation's numbers as table columns: `<split>/...` metrics and health, `retention/...`."""
    return {
        **{f"{split}/{k}": scores[k] for k in ("ndcg@10", "recall@100", "mrr@10", "map", "queries", "docs")},
        "eval/task": scores["task"],
        "eval/task_hash": scores["task_hash"],
        "eval/seconds": scores["seconds"],
        "eval/index": scores["index"],
        **{f"{split}/{k}": v for k, v in scores.items() if k.startswith("health/") and not isinstance(v, list)},
        **{f"{split}/{k}": v for k, v in scores.items() if k.startswith("dim")},  # `EvalConfig.dims`
        **{k: v for k, v in scores.items() if k.startswith("retention/")},
    }
