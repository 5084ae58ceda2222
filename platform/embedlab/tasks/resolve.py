"""Where the tasks a trial is scored on live: a BEIR directory as given, a built-in task inside
prepared data, a Hub task materialised in the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embedlab.core.config import EvalConfig
from embedlab.core.errors import UsageError
from embedlab.tasks.builtin_tasks import BUILTIN_TASKS
from embedlab.tasks.hub_tasks import materialise_hub_task


def resolve_task(name_or_path: str, prepared_dir: Path | None = None) -> Path:
    """A BEIR directory as given, or a built-in task's directory inside prepared data."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if name_or_path in BUILTIN_TASKS:
        if prepared_dir is None:
            raise UsageError(f"built-in task {name_or_path!r} needs prepared data")
        return Path(prepared_dir) / "tasks" / name_or_path
    raise FileNotFoundError(
        f"task {name_or_path!r} is neither a BEIR directory (corpus.jsonl, queries.jsonl, "
        f"qrels/test.tsv) nor a built-in task ({', '.join(BUILTIN_TASKS)})"
    )


def resolve_eval_tasks(config: EvalConfig, prepared_dir: Path | None = None,
                       cache_dir: Path | None = None) -> list[tuple[str, Path]]:
    """(name, BEIR directory) of every task `config` scores on: the main `task` first, then
    `tasks` (as `resolve_task`), then `hub_tasks`, materialised in `cache_dir` (default
    EMBEDLAB_CACHE) by `hub_tasks.materialise_hub_task`. One entry without a panel."""
    directories = [resolve_task(task, prepared_dir) for task in (config.task, *config.tasks)]
    directories += [materialise_hub_task(spec, cache_dir).directory for spec in config.hub_tasks]
    return list(zip(config.task_names, directories))


def arm_eval_tasks(config: EvalConfig, record: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, BEIR directory) of every task an arm is scored on, the main task first: as the
    sweep's `prepare_arms` resolved them into the arm's prepared record ("eval_tasks", a panel's
    only), else `resolve_eval_tasks` inside the arm's prepared data, `record["directory"]`."""
    if "eval_tasks" in record:
        return [(str(name), str(directory)) for name, directory in record["eval_tasks"]]
    return [(name, str(directory)) for name, directory in resolve_eval_tasks(config, Path(record["directory"]))]
