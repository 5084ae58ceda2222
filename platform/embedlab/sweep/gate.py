"""What a sweep refuses before any trial starts: training data holding final-eval items that
its study does not disclose, and a pair schedule that the frozen pairs cannot fill; and the
audit of every training stage of a prepared data directory (`embedlab data audit`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from embedlab.contamination.audit import AuditReport, audit
from embedlab.contamination.stages import ALL_STAGES, MINED_STAGE, PAIRS_STAGE, PHASE1_STAGES, TEACHER_STAGE
from embedlab.core.beir import load_task
from embedlab.core.config import DataConfig
from embedlab.core.errors import UsageError
from embedlab.negatives.mining import NEGATIVES_FILE
from embedlab.negatives.reading import mined_set_items
from embedlab.pairs.audit import check_training_data, pair_texts, table_items
from embedlab.pairs.builders import PAIR_BUILDERS, build_pairs
from embedlab.pairs.table import PAIR_TABLES, pair_table_name, pair_table_path
from embedlab.pairs.user import user_pair_table, user_pairs_dir
from embedlab.prepared.audits import phase1_stages
from embedlab.prepared.directory import PreparedData
from embedlab.sources.mixture import MixtureError
from embedlab.studies.study import Study
from embedlab.tasks.resolve import arm_eval_tasks
from embedlab.teacher.embeddings import EMBEDDINGS_FILE, teacher_embedding_items
from embedlab.teacher.labels import LABELS_FILE, teacher_label_items
from embedlab.train.trial_data import trial_pair_schedule


def check_contamination(study: Study, prepared: dict[str, dict], progress: Callable[[str], None]) -> list[dict]:
    """Refuse training data holding final-eval items unless the study discloses its policy.

    Before any trial starts, each arm's stages against its evaluation task: the phase-1
    stages of its data (pretraining text of its sources, the tokenizer sample) and, in phases
    2-3, the frozen pairs table of its builders (built here if no trial built it yet). Phase
    3's mined negatives exist only once a trial has mined them: `run_contrastive` checks them
    there, before it trains."""
    findings: dict[str, dict] = {}
    checked: set[tuple[str, str, str | None]] = set()
    for arm, config in study.arms.items():
        record = prepared[arm]
        data = PreparedData(Path(record["directory"]), record)
        builders = sorted(dict(config.contrastive.pairs)) if config.spec.reads_pairs else []
        # A user's pair sources (config.data.pair_files ...) join the table: their queries,
        # positives and given negatives are checked with the built-in pairs.
        pairs_path = pair_table_path(data, builders, progress, data=config.data) if builders else None
        for _, task_dir in arm_eval_tasks(config.eval, record):  # every task of a panel
            if (record["directory"], task_dir, str(pairs_path)) in checked:
                continue
            checked.add((record["directory"], task_dir, str(pairs_path)))
            for finding in check_training_data(data, Path(task_dir), study.disclosed_overlap, progress,
                                               pairs_path=pairs_path):
                findings.setdefault(json.dumps(finding, sort_keys=True), finding)  # arms sharing data find it once
    if findings:
        progress(f"audit: {len(findings)} final-eval item(s) overlap the training data; "
                 f"disclosed-overlap policy: {study.disclosed_overlap}")
    else:
        progress("audit: no final-eval item found in the training data")
    return list(findings.values())


def check_pair_schedules(study: Study, prepared: dict[str, dict], parent: str | None) -> None:
    """Refuse, before any trial starts, a phase-2/3 arm whose pair schedule the frozen pairs
    cannot fill within the repetition cap (`data.mixture.max_epochs`): otherwise every trial
    of that arm fails inside Ray, one after the other, and the study ranks the arms that ran."""
    if not study.spec.reads_pairs:
        return
    for arm in study.arms:
        trial = study.trial_config(arm, study.seeds[0], parent)
        data = PreparedData(Path(prepared[arm]["directory"]), prepared[arm])
        builders = list(dict(trial.contrastive.pairs))
        path = pair_table_path(data, builders, lambda _: None, data=trial.data)
        # Recorded for the trials: they read this table (on any node, a copy of it) instead of
        # hashing the user's pair files again, which live on this machine only.
        prepared[arm].setdefault(PAIR_TABLES, {})[pair_table_name(builders)] = path.relative_to(data.directory).as_posix()
        try:
            trial_pair_schedule(trial, path)
        except MixtureError as error:
            raise UsageError(f"study {study.name}, arm {arm}: its budget schedules more pairs than the frozen pairs "
                             f"hold: {error}; lower the budget or the profile's pairs") from None


def _pairs(prepared: PreparedData, user_pairs: Callable[[], Iterator[tuple[str, str]]] | None
           ) -> Iterator[tuple[str, str]]:
    table = prepared.corpus.read(split="train")
    pairs = build_pairs(table, list(PAIR_BUILDERS), split="train", seed=0, max_pairs_per_builder=None)
    yield from pair_texts((pair.pair_id, pair.query, pair.positive) for pair in pairs)
    if user_pairs is not None:
        yield from user_pairs()


def _mined(prepared: PreparedData) -> Iterator[tuple[str, str]]:
    for path in sorted((prepared.directory / "mined").glob(f"*/{NEGATIVES_FILE}")):
        yield from mined_set_items(path.parent)


def _teacher_sets(prepared: PreparedData) -> Iterator[tuple[str, str]]:
    for path in sorted((prepared.directory / "teacher-labels").glob(f"*/{LABELS_FILE}")):
        yield from teacher_label_items(path.parent)
    for path in sorted((prepared.directory / "teacher-embeddings").glob(f"*/{EMBEDDINGS_FILE}")):
        yield from teacher_embedding_items(path.parent)


def training_stages(
    prepared: PreparedData, stages: tuple[str, ...] = PHASE1_STAGES, *,
    user_pairs: Callable[[], Iterator[tuple[str, str]]] | None = None,
) -> dict[str, Iterator[tuple[str, str]]]:
    """Lazy (id, text) streams for the named stages (`embedlab.contamination.stages`); `user_pairs`
    (the items of a spec's user pair sources, which the prepared record does not hold: `run_audit`
    freezes and reads them) is called for the contrastive-pairs stage after the built-in pairs."""
    unknown = sorted(set(stages) - set(ALL_STAGES))
    if unknown:
        raise ValueError(f"unknown stages {unknown}; valid: {list(ALL_STAGES)}")
    streams = {
        **phase1_stages(prepared),
        PAIRS_STAGE: lambda: _pairs(prepared, user_pairs),
        MINED_STAGE: lambda: _mined(prepared),
        TEACHER_STAGE: lambda: _teacher_sets(prepared),
    }
    return {name: streams[name]() for name in stages}


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
    return audit(tasks, training_stages(prepared, tuple(stages), user_pairs=user_pairs),
                 threshold=prepared.near_duplicate_threshold, progress=progress)


def _user_pair_items(prepared: PreparedData, data: DataConfig, progress: Callable[[str], None]
                     ) -> Iterator[tuple[str, str]]:
    """The texts of `data`'s user pairs (train split), frozen in the directory first if they are not yet."""
    directory = user_pairs_dir(prepared, data, progress)
    yield from table_items(user_pair_table(directory, list(data.pair_source_names)))
