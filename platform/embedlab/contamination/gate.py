"""The gate training passes through: final-eval items in what a trial trains on refuse it.

The gate refuses final-eval (test-split) items in what a trial trains on, unless the study
declares a disclosed-overlap policy (then recorded with the run and printed with its table):

    every phase   the phase-1 stages of the data (pretraining text of the mixture's sources,
                  the tokenizer sample the tokenizer every phase uses was trained on)
    phases 2-3    the frozen pairs table of the arm's builders, a user's own pair sources
                  included: their queries, every positive and their given negatives
                  (`embedlab.pairs.table.check_training_data`)
    phase 3       the mined negatives and the teacher's sets, once made and before training
                  (`embedlab.negatives.reading.check_mined_negatives`,
                  `embedlab.teacher.labels.check_teacher_labels`,
                  `embedlab.teacher.embeddings.check_teacher_embeddings`)

Each check reads a saved audit (`embedlab.contamination.saved`), computed once per task content
and file content. The sweep runs them for every arm before any trial starts
(`embedlab.sweep.gate`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from embedlab.contamination.audit import ContaminationError
from embedlab.contamination.saved import stage_file_audit


def final_eval(content: dict) -> list[dict]:
    """The final-eval (test-split) findings of a saved audit."""
    return [f for f in content["findings"] if f["split"] == "test"]


def refuse_unless_disclosed(final: list[dict], where: Path, policy: str | None) -> None:
    """ContaminationError naming the findings in `where`, unless `policy` discloses the overlap."""
    if not final or (policy is not None and policy.strip()):
        return
    examples = "; ".join(
        f"{f['task']} {f['item_kind']} {f['item_id']} ~ {f['stage']} {f['stage_item_id']} ({f['match']})"
        for f in final[:3]
    )
    stages = ", ".join(sorted({f["stage"] for f in final}))
    raise ContaminationError(
        f"{len(final)} final-eval finding(s) in the training data {where} (stages {stages}; e.g. {examples}); "
        "training refused. Remove them, or declare the overlap with Study(disclosed_overlap='...') to train "
        "anyway with the policy printed in every table"
    )


def check_stage_set(audits_dir: Path, threshold: float, task_dir: Path, stage: str, directory: Path, path: Path,
                    items: Iterable[tuple[str, str]], what: str, policy: str | None,
                    progress: Callable[[str], None]) -> list[dict]:
    """One saved set's final-eval findings (a `stage` audit of its file `path`, saved in
    `audits_dir`), refused unless disclosed."""
    final = final_eval(stage_file_audit(audits_dir, threshold, task_dir, stage, path, items, progress))
    refuse_unless_disclosed(final, directory, policy)
    if final:
        progress(f"audit: {len(final)} final-eval item(s) among {what} in {directory}; "
                 f"disclosed-overlap policy: {policy}")
    return final
