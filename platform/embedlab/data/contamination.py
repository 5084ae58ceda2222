"""The contamination audit of a prepared data directory, and the gate training passes through.

`prepare_data` audits the phase-1 stages (pretraining text, tokenizer sample) against every
task built with the data and saves each report under `audits/<task hash>.json`; `embedlab data
audit` also covers contrastive pairs and mined negatives, and extra BEIR tasks. Before a
sweep trains, `check_training_data` refuses data in which final-eval (test-split) items
were found, unless the study declares a disclosed-overlap policy; the policy is then
recorded with the run and printed with its table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from embedlab.data.audit import AuditReport, ContaminationError, audit
from embedlab.data.prepare import PreparedData
from embedlab.data.stages import PHASE1_STAGES, training_stages
from embedlab.evaluate.beir import load_task

def _audit_tasks(
    prepared: PreparedData, tasks: list, stages: Sequence[str], progress: Callable[[str], None]
) -> AuditReport:
    return audit(
        tasks,
        training_stages(prepared, tuple(stages)),
        threshold=prepared.record["config"]["near_duplicate_threshold"],
        progress=progress,
    )


def run_audit(
    prepared: PreparedData,
    *,
    stages: Sequence[str] = PHASE1_STAGES,
    extra_tasks: Sequence[str | Path] = (),
    progress: Callable[[str], None] = print,
) -> AuditReport:
    """Every task built with the data plus `extra_tasks` against the named stages."""
    task_dirs = sorted((prepared.directory / "tasks").glob("*")) + [Path(p) for p in extra_tasks]
    tasks = [load_task(d) for d in task_dirs]
    progress(f"audit: {len(tasks)} task(s) against stages {', '.join(stages)}")
    return _audit_tasks(prepared, tasks, stages, progress)


def task_audit(prepared: PreparedData, task_dir: Path, progress: Callable[[str], None] = print) -> dict:
    """The phase-1 audit of one task against this data, computed once per task content and
    saved as `audits/<task hash>.json` (findings, counts and the markdown report)."""
    task = load_task(task_dir)
    path = prepared.directory / "audits" / f"{task.hash}.json"
    if path.is_file():
        return json.loads(path.read_text())
    progress(f"audit: task {task.name} ({task_dir}) against stages {', '.join(PHASE1_STAGES)}")
    report = _audit_tasks(prepared, [task], PHASE1_STAGES, progress)
    content = {**report.to_dict(), "markdown": report.to_markdown()}
    path.parent.mkdir(exist_ok=True)
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(content, indent=2, sort_keys=True))
    staging.rename(path)
    return content


def check_training_data(
    prepared: PreparedData, task_dir: Path, policy: str | None, progress: Callable[[str], None] = print
) -> list[dict]:
    """Final-eval findings of the task in this data; raises ContaminationError if any and no policy."""
    final = [f for f in task_audit(prepared, task_dir, progress)["findings"] if f["split"] == "test"]
    if final and policy is None:
        examples = "; ".join(
            f"{f['task']} {f['item_kind']} {f['item_id']} ~ {f['stage']} {f['stage_item_id']} ({f['match']})"
            for f in final[:3]
        )
        raise ContaminationError(
            f"{len(final)} final-eval finding(s) in the training data {prepared.directory} "
            f"(e.g. {examples}); training refused. Remove them, or declare the overlap with "
            "Study(disclosed_overlap='...') to train anyway with the policy printed in every table"
        )
    return final
