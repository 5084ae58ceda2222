"""Each arm's prepared data for a sweep: prepared once per distinct data config, with its
evaluation tasks resolved, and, where the run's storage is remote, published for every node
to fetch by hash."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from embedlab.artifacts.sync import publish, remote_root
from embedlab.core import store
from embedlab.core.beir import load_task
from embedlab.core.errors import UsageError
from embedlab.tasks.resolve import arm_eval_tasks, resolve_eval_tasks
from embedlab.prepared.build import prepare_data
from embedlab.prepared.directory import PreparedData
from embedlab.studies.study import Study


def prepare_arms(study: Study, progress: Callable[[str], None]) -> dict[str, dict]:
    """Prepare each distinct data config once; map every arm to its prepared record."""
    by_config: dict[str, PreparedData] = {}
    out: dict[str, dict] = {}
    for arm, config in study.arms.items():
        key = json.dumps(config.data.phase1_dict(), sort_keys=True, default=str)  # pair sources share it
        if key not in by_config:
            by_config[key] = prepare_data(config.data, progress=progress)
        prepared = by_config[key]
        out[arm] = {**prepared.record, "directory": str(prepared.directory)}
    scored_on = set()
    for arm, config in study.arms.items():
        if config.eval.panel:  # resolved (Hub tasks materialised) once, here, for every trial
            out[arm]["eval_tasks"] = [[name, str(directory)] for name, directory in
                                      resolve_eval_tasks(config.eval, Path(out[arm]["directory"]))]
        task_dirs = [Path(directory) for _, directory in arm_eval_tasks(config.eval, out[arm])]
        if not task_dirs[0].is_dir():
            raise FileNotFoundError(f"arm {arm}: evaluation task {config.eval.task!r} was not built")
        scored_on.add((tuple(load_task(directory).hash for directory in task_dirs), config.eval.split))
    if len(scored_on) != 1:
        raise UsageError("arms are scored on different task contents or splits; comparison refused")
    return out


def publish_prepared(prepared: dict[str, dict], storage: str, progress: Callable[[str], None]) -> None:
    """Publish each arm's prepared directory under `storage` (`prepared_sync.publish`) and
    record where and its tree hash in the arm's record, which every trial fetches by."""
    published: dict[str, str] = {}
    for record in prepared.values():
        directory = record["directory"]
        if directory not in published:
            published[directory] = publish(Path(directory), storage, progress)
        record["published"] = store.join(remote_root(storage), Path(directory).name)
        record["tree_hash"] = published[directory]
