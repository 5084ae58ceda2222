"""Reference scores a study's table shows beside its arms, from models it did not train.

The parent (`parent_scores` in study.json, scored by the sweep's evaluator before any trial)
says what the phase gained or lost; for a study that distils a teacher, the teacher itself
(`teacher_scores`, scored by `embedlab.tasks.baselines` on the same task, split and
queries) is what "distilling MiniLM" is measured against. Neither is an arm: neither is in the
paired test, and each is scored once per run.
"""

from __future__ import annotations

from typing import Any

from embedlab.tasks.metrics import METRIC_NAMES


def distilled_teacher(arms: dict[str, Any]) -> str | None:
    """The teacher any arm's config distils from (a teacher with a weight), else None."""
    for config in arms.values():
        settings = config.contrastive
        if settings.distillation.teacher and settings.distillation.weight > 0:
            return settings.distillation.teacher
    return None


def score_teacher(name: str, task_dir: str, split: str) -> dict[str, Any]:
    """The teacher's `<split>/<metric>` scores on the task at `task_dir`, with the task's hash
    and the teacher's identity."""
    # here: torch and transformers (the teacher's model), which reading a table does not need
    from embedlab.core.beir import load_task
    from embedlab.tasks.baselines import evaluate_baseline

    scores = evaluate_baseline(name, load_task(task_dir), split)
    return {**{f"{split}/{metric}": float(scores[metric]) for metric in METRIC_NAMES},
            "eval/task_hash": scores["task_hash"], "teacher": name, "encoder": scores["encoder"]}


def reference_line(record: dict[str, Any], metrics: list[str]) -> str:
    """One line naming each reference model's score on `metrics` (those it has), or ""."""
    parts = []
    for label, scores in (("parent", record.get("parent_scores")),
                          (f"teacher {(record.get('teacher_scores') or {}).get('teacher', '')}".rstrip(),
                           record.get("teacher_scores"))):
        shown = [f"{m} {scores[m]:.4f}" for m in metrics if isinstance((scores or {}).get(m), (int, float))]
        if shown:
            parts.append(f"{label}: {', '.join(shown)}")
    return f"references, not trained in this study (same split and queries): {'; '.join(parts)}" if parts else ""
