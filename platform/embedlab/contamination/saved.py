"""Audits computed once and saved beside the data they audit, under an `audits/` directory.

`stage_file_audit` audits one stage file (a frozen pairs table, a mined set, a teacher set)
against one task and saves the report as `<audits dir>/<task hash>-<stage>-<file hash>.json`,
so it is computed once per task content and file content, and a changed file is audited
afresh. The phase-1 audit of a prepared directory is saved the same way
(`embedlab.prepared.audits`); the gate that reads them is `embedlab.contamination.gate`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from embedlab.artifacts.build import write_json_staged
from embedlab.contamination.audit import AuditReport, audit
from embedlab.core.beir import load_task
from embedlab.core.store import file_sha256


def report_content(report: AuditReport) -> dict:
    """What a saved audit holds: the report's findings and counts, and its markdown."""
    return {**report.to_dict(), "markdown": report.to_markdown()}


def stage_file_audit(
    audits_dir: Path, threshold: float, task_dir: Path, stage: str, path: Path, items: Iterable[tuple[str, str]],
    progress: Callable[[str], None] = print,
) -> dict:
    """One task against one stage file's `items` (a pairs table, a mined set) at the near-duplicate
    `threshold`, computed once per task content and file content and saved in `audits_dir` as
    `<task hash>-<stage>-<file hash>.json`."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"stage {stage}: no file {path} to audit")
    task = load_task(task_dir)
    saved = Path(audits_dir) / f"{task.hash}-{stage}-{file_sha256(path)[:16]}.json"
    if saved.is_file():
        return json.loads(saved.read_text())
    progress(f"audit: task {task.name} ({task_dir}) against stage {stage} ({path})")
    content = report_content(audit([task], {stage: items}, threshold=threshold, progress=progress))
    write_json_staged(saved, content)
    return content
