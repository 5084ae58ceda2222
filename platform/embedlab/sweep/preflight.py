"""The checks a sweep runs before Ray starts, and all that `--dry-run` runs: everything a study
reads that can be checked without Ray and without training.

    storage     no credential in the location; a scheme pyarrow opens; a local path whose
                nearest existing folder is a writable directory
    resume      the folder is a run directory of this study (its study.json, same study hash)
                and every trial row in it reads as one
    arms        every arm's trial config builds; in phases 2-3 every name in
                `contrastive.pairs` is a built-in builder or one of the arm's pair sources
    pair sources  every local one (pair files, BEIR folders, local Hugging Face folders) is
                read whole: it exists, parses, has the columns, and gives at least one pair
    documents   every local document source exists and gives at least one document
    tasks       every evaluation task that is a folder loads as a BEIR task (built-in tasks
                are built with the prepared data; hub tasks are fetched then)

A source named by several arms is read once. Each check raises the one-line user error the
part it calls already has (SourceError, ConfigError, TaskFormatError, UsageError).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from embedlab.core import store
from embedlab.core.beir import load_task
from embedlab.core.config.sources import HFPairs, LocalFiles, SourceError
from embedlab.core.errors import RunRecordError, UsageError
from embedlab.pairs.readers import PairReadStats, read_pairs
from embedlab.pairs.table import check_pair_shares
from embedlab.records.rundir import finished_rows
from embedlab.sources.external import iter_external
from embedlab.stats.table import read_study_record
from embedlab.studies.study import Study
from embedlab.tasks.builtin_tasks import BUILTIN_TASKS


def preflight(study: Study, *, storage: str | Path | None = None, resume: str | Path | None = None,
              parent: str | None = None, progress: Callable[[str], None] = lambda line: None) -> list[str]:
    """Run every check (module docstring) and return one line per thing checked."""
    lines = []
    if resume is not None:
        lines.append(check_resume(resume, study))
    elif storage is not None:
        lines.append(check_storage(storage))
    pair_sources, documents, tasks = {}, {}, {}
    for arm in study.arms:
        config = study.trial_config(arm, study.seeds[0], (parent or "PARENT") if study.needs_parent else parent)
        if config.spec.reads_pairs:
            check_pair_shares(dict(config.contrastive.pairs), config.data)
        for source in config.data.pair_sources:
            pair_sources.setdefault(source, None)
        for source in config.data.local_files:
            documents.setdefault(source, None)
        for task in (config.eval.task, *config.eval.tasks):
            tasks.setdefault(task, None)
    for source in pair_sources:
        if isinstance(source, HFPairs) and not Path(source.dataset).is_dir():
            lines.append(f"pair source {source.name}: hub dataset {source.dataset} (fetched when data are prepared)")
            continue
        progress(f"preflight: reading pair source {source.name}")
        lines.append(check_pair_source(source))
    for source in documents:
        lines.append(check_documents(source))
    for task in tasks:
        lines.append(check_task(task))
    return lines


def check_storage(storage: str | Path) -> str:
    """The storage location: no credential, a filesystem pyarrow opens, and (local) a folder
    that exists or can be made and is writable."""
    store.check_location(storage)
    if store.is_uri(storage):
        store.filesystem(storage)  # an unknown scheme or an unreachable store is refused here
        return f"storage {storage}: opens"
    path = Path(storage).resolve()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"storage {storage}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"storage {storage}: {existing} is not writable by this user")
    return f"storage {storage}: " + ("a writable folder" if existing == path else "will be made, in a writable folder")


def check_resume(run_dir: str | Path, study: Study) -> str:
    """`--resume RUN_DIR`: a run directory of this very study (same study hash)."""
    try:
        record = read_study_record(store.check_location(run_dir))
    except FileNotFoundError:
        raise UsageError(f"--resume {run_dir}: not a run directory (no study.json in it)") from None
    except RunRecordError as error:
        raise UsageError(f"--resume {run_dir}: {error}") from None
    if record.get("study_hash") != study.hash:
        raise UsageError(f"--resume {run_dir}: a run of study {record['study']['name']!r} (hash "
                         f"{str(record.get('study_hash'))[:12]}), not of study {study.name!r} as loaded now "
                         f"(hash {study.hash[:12]}); resume refused so the two are never mixed")
    try:
        rows = finished_rows(store.resolve(run_dir))  # each trial row readable, before Ray starts
    except RunRecordError as error:
        raise UsageError(f"--resume {run_dir}: {error}") from None
    return f"resume {run_dir}: a run of study {study.name}, {len(rows)} trial rows"


def check_pair_source(source) -> str:
    """Read a local pair source whole; refused when it gives no pair."""
    stats = PairReadStats()
    pairs = read_pairs(source, stats=stats)
    where = getattr(source, "path", None) or getattr(source, "dataset", "")
    if not pairs:
        skipped = "; ".join(f"{n} {reason}" for reason, n in stats.skipped.most_common(3))
        raise SourceError(f"pair source {source.name!r} ({where}): no pairs: an empty source is refused"
                          + (f" ({stats.records} records, skipped: {skipped})" if skipped else
                             f" ({stats.records} records)"))
    return f"pair source {source.name} ({where}): {len(pairs):,} pairs"


def check_documents(source: LocalFiles) -> str:
    """A local document source exists and gives at least one document."""
    if next(iter_external(source, limit=1), None) is None:
        raise SourceError(f"source {source.name!r} ({source.path}): no documents: an empty source is refused")
    return f"documents {source.name} ({source.path}): readable"


def check_task(task: str) -> str:
    """An evaluation task: a built-in name, or a folder that loads as a BEIR task."""
    if task in BUILTIN_TASKS and not Path(task).is_dir():
        return f"task {task}: built-in (built with the prepared data)"
    if not Path(task).is_dir():
        raise UsageError(f"eval task {task!r}: neither a BEIR directory (corpus.jsonl, queries.jsonl, "
                         f"qrels/test.tsv) nor a built-in task ({', '.join(BUILTIN_TASKS)})")
    loaded = load_task(task)
    return f"task {task}: {len(loaded.queries):,} queries, {len(loaded.corpus):,} documents"
