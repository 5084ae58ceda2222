"""The contamination audit of a prepared data directory, and the gate training passes through.

`prepare_data` audits the phase-1 stages (pretraining text, tokenizer sample) against every
task built with the data and saves each report under `audits/<task hash>.json`
(`embedlab.data.saved_audits`); `embedlab data audit` also covers contrastive pairs (the
built-in builders' and the spec's user pair sources') and mined negatives, and extra BEIR tasks.

The gate refuses final-eval (test-split) items in what a trial trains on, unless the study
declares a disclosed-overlap policy (then recorded with the run and printed with its table):

    every phase   the phase-1 stages of the data (pretraining text of the mixture's sources,
                  the tokenizer sample the tokenizer every phase uses was trained on)
    phases 2-3    the frozen pairs table of the arm's builders (`check_training_data` with
                  `pairs_path`), a user's own pair sources included: their queries, every
                  positive and their given negatives; the sweep checks both before any trial starts
    phase 3       the mined negatives, once mined and before training (`check_mined_negatives`,
                  run by `run_contrastive` right after mining)

A stage file's audit is saved as `audits/<task hash>-<stage>-<file hash>.json`, so it is
computed once per task content and file content, and a changed file is audited afresh
(`embedlab.data.saved_audits`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from embedlab.config import DataConfig
from embedlab.data.audit import AuditReport, ContaminationError
from embedlab.data.prepared import PreparedData
from embedlab.data.saved_audits import audit_stages, stage_file_audit, task_audit
from embedlab.data.stages import (
    MINED_STAGE, NEGATIVES_FILE, PAIRS_STAGE, PHASE1_STAGES, TEACHER_STAGE, mined_set_items, pair_table_items, table_items,
)
from embedlab.data.teacher_embeddings import EMBEDDINGS_FILE, teacher_embedding_items
from embedlab.data.teacher_labels import LABELS_FILE, teacher_label_items
from embedlab.data.user_pairs import user_pair_table, user_pairs_dir
from embedlab.evaluate.beir import load_task


def run_audit(
    prepared: PreparedData,
    *,
    stages: Sequence[str] = PHASE1_STAGES,
    extra_tasks: Sequence[str | Path] = (),
    progress: Callable[[str], None] = print,
    data: DataConfig | None = None,
) -> AuditReport:
    """Every task built with the data plus `extra_tasks` against the named stages; `data`, the
    spec's config, puts its user pair sources in the contrastive-pairs stage (`training_stages`)."""
    task_dirs = sorted((prepared.directory / "tasks").glob("*")) + [Path(p) for p in extra_tasks]
    tasks = [load_task(d) for d in task_dirs]
    progress(f"audit: {len(tasks)} task(s) against stages {', '.join(stages)}")
    user_pairs = None
    if data is not None and data.pair_sources:
        user_pairs = lambda: _user_pair_items(prepared, data, progress)  # noqa: E731
    return audit_stages(prepared, tasks, stages, progress, user_pairs)


def _user_pair_items(prepared: PreparedData, data: DataConfig, progress: Callable[[str], None]
                     ) -> Iterator[tuple[str, str]]:
    """The texts of `data`'s user pairs (train split), frozen in the directory first if they are not yet."""
    directory = user_pairs_dir(prepared, data, progress)
    yield from table_items(user_pair_table(directory, list(data.pair_source_names)))


def _final_eval(content: dict) -> list[dict]:
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


def check_training_data(
    prepared: PreparedData, task_dir: Path, policy: str | None, progress: Callable[[str], None] = print,
    *, pairs_path: Path | None = None,
) -> list[dict]:
    """Final-eval findings of the task in the phase-1 stages of this data and, with
    `pairs_path` (a phase 2-3 trial's frozen pairs table), in its pairs; raises
    ContaminationError if any and no policy."""
    final = _final_eval(task_audit(prepared, task_dir, progress))
    if pairs_path is not None:
        content = stage_file_audit(prepared, task_dir, PAIRS_STAGE, pairs_path, pair_table_items(pairs_path), progress)
        final += _final_eval(content)
    refuse_unless_disclosed(final, prepared.directory, policy)
    return final


def check_teacher_labels(
    prepared: PreparedData, task_dir: Path, labels_dir: Path, policy: str | None,
    progress: Callable[[str], None] = print,
) -> list[dict]:
    """Final-eval findings of the task among the texts a teacher scored for a trial (checked after
    scoring, before training on the labels); raises ContaminationError if any and no policy."""
    labels_dir = Path(labels_dir)
    return _check_stage_set(prepared, task_dir, TEACHER_STAGE, labels_dir, labels_dir / LABELS_FILE,
                            teacher_label_items(labels_dir), "the teacher-scored texts", policy, progress)


def check_teacher_embeddings(
    prepared: PreparedData, task_dir: Path, embeddings_dir: Path, policy: str | None,
    progress: Callable[[str], None] = print,
) -> list[dict]:
    """Final-eval findings of the task among the documents a teacher encoded for a trial's
    embedding distillation (checked after encoding, before training on them); raises
    ContaminationError if any and no policy."""
    embeddings_dir = Path(embeddings_dir)
    return _check_stage_set(prepared, task_dir, TEACHER_STAGE, embeddings_dir, embeddings_dir / EMBEDDINGS_FILE,
                            teacher_embedding_items(embeddings_dir), "the teacher-encoded documents", policy,
                            progress)


def check_mined_negatives(
    prepared: PreparedData, task_dir: Path, mined_dir: Path, policy: str | None,
    progress: Callable[[str], None] = print,
) -> list[dict]:
    """Final-eval findings of the task in one mined set's negatives (checked after mining,
    before training on them); raises ContaminationError if any and no policy."""
    mined_dir = Path(mined_dir)
    return _check_stage_set(prepared, task_dir, MINED_STAGE, mined_dir, mined_dir / NEGATIVES_FILE,
                            mined_set_items(mined_dir), "the mined negatives", policy, progress)


def _check_stage_set(prepared: PreparedData, task_dir: Path, stage: str, directory: Path, path: Path, items,
                     what: str, policy: str | None, progress: Callable[[str], None]) -> list[dict]:
    """One saved set's final-eval findings (a `stage` audit of its file `path`), refused unless
    disclosed."""
    final = _final_eval(stage_file_audit(prepared, task_dir, stage, path, items, progress))
    refuse_unless_disclosed(final, directory, policy)
    if final:
        progress(f"audit: {len(final)} final-eval item(s) among {what} in {directory}; "
                 f"disclosed-overlap policy: {policy}")
    return final
