"""The gate for what a teacher made for a trial: the texts it scored, the documents it encoded.

Both are training input: checked against the trial's evaluation tasks after they are made and
before any step uses them (`embedlab.contamination.gate`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from embedlab.contamination.gate import check_stage_set
from embedlab.contamination.stages import TEACHER_STAGE
from embedlab.prepared.directory import PreparedData
from embedlab.teacher.embeddings import EMBEDDINGS_FILE, teacher_embedding_items
from embedlab.teacher.labels import LABELS_FILE, teacher_label_items


def check_teacher_labels(
    prepared: PreparedData, task_dir: Path, labels_dir: Path, policy: str | None,
    progress: Callable[[str], None] = print,
) -> list[dict]:
    """Final-eval findings of the task among the texts a teacher scored for a trial (checked after
    scoring, before training on the labels); raises ContaminationError if any and no policy."""
    labels_dir = Path(labels_dir)
    return check_stage_set(prepared.audits_dir, prepared.near_duplicate_threshold, task_dir, TEACHER_STAGE,
                           labels_dir, labels_dir / LABELS_FILE, teacher_label_items(labels_dir),
                           "the teacher-scored texts", policy, progress)


def check_teacher_embeddings(
    prepared: PreparedData, task_dir: Path, embeddings_dir: Path, policy: str | None,
    progress: Callable[[str], None] = print,
) -> list[dict]:
    """Final-eval findings of the task among the documents a teacher encoded for a trial's
    embedding distillation (checked after encoding, before training on them); raises
    ContaminationError if any and no policy."""
    embeddings_dir = Path(embeddings_dir)
    return check_stage_set(prepared.audits_dir, prepared.near_duplicate_threshold, task_dir, TEACHER_STAGE,
                           embeddings_dir, embeddings_dir / EMBEDDINGS_FILE, teacher_embedding_items(embeddings_dir),
                           "the teacher-encoded documents", policy, progress)
