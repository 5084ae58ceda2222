"""Audits of a prepared data directory computed once and saved in it, under `audits/`.

`task_audit` audits the phase-1 stages (pretraining text, tokenizer sample) against one task
and saves the report as `audits/<task hash>.json`; `prepare_data` runs it for every task built
with the data, and the data card reads it. `stage_file_audit` audits one stage file (a frozen
pairs table, a mined set) against one task and saves it as
`audits/<task hash>-<stage>-<file hash>.json`, so it is computed once per task content and
file content, and a changed file is audited afresh. The gate that reads them is
`embedlab.data.contamination`.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from embedlab.data.audit import AuditReport, audit
from embedlab.data.prepared import PreparedData
from embedlab.data.stages import PHASE1_STAGES, training_stages
from embedlab.evaluate.beir import load_task


def audit_stages(
    prepared: PreparedData, tasks: list, stages: Sequence[str], progress: Callable[[str], None],
    user_pairs: Callable[[], Iterator[tuple[str, str]]] | None = None,
) -> AuditReport:
    """`tasks` against the named stages of `prepared` (`user_pairs`: `training_stages`')."""
    return audit(
        tasks,
        training_stages(prepared, tuple(stages), user_pairs=user_pairs),
        threshold=prepared.record["config"]["near_duplicate_threshold"],
        progress=progress,
    )


def _write_json_atomically(path: Path, content: dict) -> None:
    """Write `path` whole or not at all. Concurrent trials may audit the same file: each
    stages under its own name (pid and a random suffix), and the rename is atomic, so a
    reader sees one writer's whole report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    staging.write_text(json.dumps(content, indent=2, sort_keys=True))
    staging.rename(path)


def _report_content(report: AuditReport) -> dict:
    return {**report.to_dict(), "markdown": report.to_markdown()}


def task_audit(prepared: PreparedData, task_dir: Path, progress: Callable[[str], None] = print) -> dict:
    """The phase-1 audit of one task against this data, computed once per task content and
    saved as `audits/<task hash>.json` (findings, counts and the markdown report)."""
    task = load_task(task_dir)
    path = prepared.directory / "audits" / f"{task.hash}.json"
    if path.is_file():
        return json.loads(path.read_text())
    progress(f"audit: task {task.name} ({task_dir}) against stages {', '.join(PHASE1_STAGES)}")
    content = _report_content(audit_stages(prepared, [task], PHASE1_STAGES, progress))
    _write_json_atomically(path, content)
    return content


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def stage_file_audit(
    prepared: PreparedData, task_dir: Path, stage: str, path: Path, items: Iterable[tuple[str, str]],
    progress: Callable[[str], None] = print,
) -> dict:
    """One task against one stage file's `items` (a pairs table, a mined set), computed once per
    task content and file content and saved as `audits/<task hash>-<stage>-<file hash>.json`."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"stage {stage}: no file {path} to audit")
    task = load_task(task_dir)
    saved = prepared.directory / "audits" / f"{task.hash}-{stage}-{_file_hash(path)}.json"
    if saved.is_file():
        return json.loads(saved.read_text())
    progress(f"audit: task {task.name} ({task_dir}) against stage {stage} ({path})")
    report = audit([task], {stage: items}, threshold=prepared.record["config"]["near_duplicate_threshold"],
                   progress=progress)
    content = _report_content(report)
    _write_json_atomically(saved, content)
    return content
