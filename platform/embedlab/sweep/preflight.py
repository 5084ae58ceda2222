"""The checks a sweep runs before Ray starts, and all that `--dry-run` runs: everything a study
reads that can be checked without Ray and without training.

    storage     not empty, no credential in the location; a scheme pyarrow opens; a local path
                whose nearest existing folder is a writable directory
    resume      the folder is a run directory of this study (its study.json, same study hash)
                and every trial row in it reads as one
    arms        every arm's trial config builds; in phases 2-3 every name in
                `contrastive.pairs` is a built-in builder or one of the arm's pair sources
    memory      one worker of every arm (at its searched maximum) fits a configured node: this
                machine or a node of the fleets in workers/ (`capacity.check_memory`)
    pair sources  every local one (pair files, BEIR folders, local Hugging Face folders) is
                read whole: it exists, parses, has the columns, and gives at least one pair
    documents   every local document source exists and gives at least one document
    tasks       every evaluation task that is a folder loads as a BEIR task (built-in tasks
                are built with the prepared data; hub tasks are fetched then)
    hub         with `resolve_hub` (a real sweep, before its cluster; a dry run downloads
                nothing and says so): every Hub dataset of documents or pairs resolves at its
                revision, from the cache when offline (HF_HUB_OFFLINE)

A source named by several arms is read once. Each check raises the one-line user error the
part it calls already has (SourceError, ConfigError, TaskFormatError, UsageError).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from embedlab.core import paths, store
from embedlab.core.beir import load_task
from embedlab.core.config.sources import HFDataset, HFPairs, LocalFiles, SourceError
from embedlab.core.errors import RunRecordError, UsageError
from embedlab.pairs.readers import PairReadStats, read_pairs
from embedlab.pairs.table import check_pair_shares
from embedlab.records.rundir import finished_rows
from embedlab.sources.external import iter_external
from embedlab.stats.table import read_study_record
from embedlab.studies.study import Study
from embedlab.sweep.capacity import FLEET_NODES, Node, at_searched_maximum, check_memory, this_machine
from embedlab.tasks.builtin_tasks import BUILTIN_TASKS


def preflight(study: Study, *, storage: str | Path | None = None, resume: str | Path | None = None,
              parent: str | None = None, progress: Callable[[str], None] = lambda line: None,
              nodes: Sequence[Node] | None = None, resolve_hub: bool = False) -> list[str]:
    """Run every check (module docstring) and return one line per thing checked. `nodes`: where
    a worker must fit (default: this machine and the fleets' nodes)."""
    store.cache_dir()  # EMBEDLAB_CACHE: a folder (or none yet) that prepared data can go into
    lines = []
    if resume is not None:
        lines.append(check_resume(resume, study))
    elif storage is not None:
        lines.append(check_storage(storage))
    pair_sources, documents, hub, tasks = {}, {}, {}, {}
    for arm in study.arms:
        config = study.trial_config(arm, study.seeds[0], (parent or "PARENT") if study.needs_parent else parent)
        if config.spec.reads_pairs:
            check_pair_shares(dict(config.contrastive.pairs), config.data)
        for source in config.data.pair_sources:
            pair_sources.setdefault(source, None)
        for source in config.data.local_files:
            documents.setdefault(source, None)
        for source in config.data.hf_datasets:
            hub.setdefault(source, None)
        for task in (config.eval.task, *config.eval.tasks):
            tasks.setdefault(task, None)
    where = "this machine or the fleets in workers/" if nodes is None else "this machine"
    lines += check_memory(at_searched_maximum(study.arms, study.search)[0],
                          (this_machine(), *FLEET_NODES) if nodes is None else nodes, where)
    for source in pair_sources:
        if isinstance(source, HFPairs) and not Path(source.dataset).is_dir():
            hub.setdefault(source, None)
            continue
        progress(f"preflight: reading pair source {source.name}")
        lines.append(check_pair_source(source))
    for source in documents:
        lines.append(check_documents(source))
    for source in hub:
        if Path(source.dataset).is_dir():
            continue
        kind = "pair source" if isinstance(source, HFPairs) else "documents"
        if resolve_hub:
            progress(f"preflight: resolving hub dataset {source.dataset}@{source.revision}")
            lines.append(check_hub_dataset(source, kind))
        else:
            lines.append(f"{kind} {source.name}: hub dataset {source.dataset} (resolved when a sweep starts, fetched "
                         "when data are prepared)")
    for task in tasks:
        lines.append(check_task(task))
    return lines


def check_hub_dataset(source: HFPairs | HFDataset, kind: str) -> str:
    """A Hub dataset resolves at its revision (offline: from the local cache), before any
    cluster starts: a SourceError naming it otherwise."""
    import datasets  # here: datasets, which takes seconds to import and a dry run does not need

    try:
        builder = datasets.load_dataset_builder(source.dataset, name=source.config, revision=source.revision)
    except Exception as error:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ...)
        offline = any(os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
                      for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
        remedy = ("offline (HF_HUB_OFFLINE), only a dataset in the local cache resolves: fetch it once online, "
                  "or unset HF_HUB_OFFLINE" if offline else "check its name, revision and the network")
        raise SourceError(f"{kind} {source.name!r}: hub dataset {source.dataset!r} at revision {source.revision!r} "
                          f"does not resolve ({type(error).__name__}); {remedy}") from None
    return f"{kind} {source.name}: hub dataset {source.dataset}@{source.revision} resolves ({builder.config.name})"


def check_storage(storage: str | Path) -> str:
    """The storage location: not empty, no credential, a filesystem pyarrow opens, and (local)
    a folder that exists or can be made and is writable."""
    store.check_location(storage)
    if store.is_uri(storage):
        store.filesystem(storage)  # an unknown scheme or an unreachable store is refused here
        return f"storage {store.redact(storage)}: opens"
    path = Path(storage).resolve()
    existing = next(p for p in (path, *path.parents) if paths.kind(p) is not None)
    if paths.kind(existing) != "a directory":
        raise UsageError(f"storage {storage}: {existing} is {paths.kind(existing)}, not a directory")
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
        raise UsageError(f"eval task {store.redact(task)!r}: neither a BEIR directory (corpus.jsonl, queries.jsonl, "
                         f"qrels/test.tsv) nor a built-in task ({', '.join(BUILTIN_TASKS)})")
    loaded = load_task(task)
    return f"task {task}: {len(loaded.queries):,} queries, {len(loaded.corpus):,} documents"
