"""Retrieval tasks in the BEIR/MTEB layout from the Hugging Face Hub, pinned and materialised as BEIR folders.

A `HubTask` names a dataset and a required revision. MTEB's layout is a dataset repository
with three configs::

    corpus    columns _id, title, text          (title may be absent or null: read as "")
    queries   columns _id, text
    qrels     columns query-id, corpus-id, score  one split per qrels split: train, dev, test

The qrels are the `default` config of the same repository or of a separate `<name>-qrels`
repository (`qrels_dataset`, with its own `qrels_revision`). Each config is read with
``datasets.load_dataset(dataset, name=config, split=..., revision=...)``; other columns are
ignored. The corpus and queries configs usually hold one split (named "corpus"/"queries",
"train" or "test" depending on the repository): that one is read unless `corpus_split` /
`queries_split` names another. The qrels are read with their three columns cast to
(string, string, float64), so that a CSV/TSV reader cannot turn the id "007" into 7; a score
must then be a whole number. Every qrels split of the config is read unless `splits` names
some; "test" is required, as in every BEIR task. A split keeps the dataset's own name: a
"validation" split is not renamed "dev".

Revisions. A Hub revision (a commit sha, tag or branch) is resolved to the commit it names
(`huggingface_hub.HfApi.dataset_info`; a full 40-hex sha is taken as it is, so no network
is needed to use a cached task pinned by sha), and the data are then read at that commit, so
what was read and what is recorded cannot differ. `datasets` ignores `revision` for a local
directory, so here a local directory's revision is a content pin: it must equal
`local_dataset_revision(path)`, ``sha256:`` + a digest of the relative path and sha256 of
every file that is not hidden (no path component starts with "."; a `.git` folder does not
count). Any edit, README text included, changes it; a mismatch raises and names the digest
the directory has now. This is a pin on content, not a version history: an old revision of a
local directory cannot be read back.

Local directories. `dataset` is a local directory when `os.path.isdir(dataset)`, as in
`datasets`. `datasets` finds a local directory's configs only in the YAML header of its
README.md (or in `.huggingface.yaml`), for example::

    ---
    configs:
    - config_name: corpus
      data_files:
      - {split: corpus, path: corpus.jsonl}
    - config_name: queries
      data_files:
      - {split: queries, path: queries.jsonl}
    - config_name: default
      data_files:
      - {split: train, path: qrels/train.jsonl}
      - {split: test, path: qrels/test.jsonl}
    ---

Subdirectories do not make configs: without that block the directory is one config,
"default", whose splits are guessed from file names (and a file named dev.* becomes the
split "validation"). One reader is chosen for all configs of a directory, from the first
config's files, so a directory cannot mix corpus.jsonl with qrels/*.tsv: keep every config in
one format, or put TSV qrels in a separate qrels directory, as MTEB does on the Hub.

Materialisation. `materialise_hub_task` writes the task with `beir.write_task` to
``<cache>/hub-tasks/<key>/<name>/`` and returns it loaded back with `beir.load_task`. The key
is a sha256 of the datasets (a local path made absolute), configs, splits, *resolved*
revisions and the dev-split settings; the name is not part of it, but names the folder,
which `load_task` uses as the task's name. The folder is written under a temporary name and
renamed into place, so it is whole or absent, and it is reused when present (after checking
that its content still has the task hash recorded). `provenance.json` in the folder records
the datasets, configs, requested and resolved revisions, row counts, the derived dev split if
any, the task hash and the sha256 of every written file; `load_task` ignores it.

A dev split. Tasks without dev qrels can get one from their train qrels: `derive_dev_split`
(or `HubTask.dev_fraction`) moves a fixed, seeded share of the train queries to dev, with
every judgement of each moved query; the materialised folder then holds it as qrels/dev.tsv
and its provenance lists the moved queries, so the split is frozen with the task.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from embedlab.core import store
from embedlab.core.beir import QRELS_HEADER, Qrels, REQUIRED_SPLIT, Task, load_task, write_task
from embedlab.core.config import build_config, read_mapping_file
from embedlab.core.config.tasks import HubTask, HubTaskError, check_fraction
from embedlab.core.store import file_sha256

HUB_TASKS_DIR = "hub-tasks"
PROVENANCE_FILE = "provenance.json"
# Bumped when the materialised folder or the way records are read changes, so an older cache
# folder is never taken for one this code would write.
LAYOUT_VERSION = 1
DEV_SPLIT = "dev"
TRAIN_SPLIT = "train"
LOCAL_REVISION_PREFIX = "sha256:"
DEV_RULE = (
    "rank the train queries by sha256(f'{seed}:{query_id}') (ties by query id), move the first "
    "k = floor(fraction * n + 0.5) of the n train queries, with all their judgements, to dev; "
    "train keeps the rest; 1 <= k <= n - 1 is required"
)
_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
_READ_BATCH_ROWS = 10_000


@dataclass(frozen=True)
class DevSplit:
    """How a task's dev split came about; `as_dict` is what provenance records.

    `origin` is "derived" (made from train qrels by `DEV_RULE`, with `fraction` and `seed`)
    or "dataset" (the task had its own dev split, kept unchanged; `fraction` and `seed` are
    then None). `query_ids` are the dev queries, sorted; `train_queries` is how many train
    queries there were before any were moved.
    """

    origin: str
    fraction: float | None
    seed: int | None
    query_ids: tuple[str, ...] = field(repr=False)
    train_queries: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "rule": DEV_RULE if self.origin == "derived" else "the dataset's own dev split, unchanged",
            "fraction": self.fraction,
            "seed": self.seed,
            "train_queries_before": self.train_queries,
            "dev_queries": len(self.query_ids),
            "query_ids": list(self.query_ids),
        }


@dataclass(frozen=True)
class MaterialisedTask:
    """A Hub task loaded back from its BEIR folder, with the folder and its provenance record."""

    task: Task
    directory: Path
    provenance: dict[str, Any] = field(repr=False)


# --- naming a task on the command line -----------------------------------------------------

HUB_PREFIX = "hub:"


def hub_task_argument(text: str, *, dev_fraction: float | None = None, dev_seed: int = 0) -> HubTask | None:
    """The HubTask a command-line task names, or None when it names none (a BEIR directory or a
    built-in task name is resolved elsewhere).

    ``hub:<dataset>@<revision>`` (the last "@" splits; a local directory in the Hub layout works
    too, pinned by its `local_dataset_revision`) names the task after the dataset's last path
    component, with the default configs; a ``.toml`` or ``.json`` file holds HubTask fields
    (name, dataset, revision, ...). `dev_fraction` / `dev_seed`, when given, set the derived dev
    split (overriding a file's)."""
    dev = {} if dev_fraction is None else {"dev_fraction": dev_fraction, "dev_seed": dev_seed}
    if text.startswith(HUB_PREFIX):
        dataset, at, revision = text.removeprefix(HUB_PREFIX).rpartition("@")
        if not at or not dataset.strip("/"):
            raise HubTaskError(f"task {text!r}: write a Hub task as {HUB_PREFIX}<dataset>@<revision>, e.g. "
                               f"{HUB_PREFIX}mteb/scifact@<commit sha>")
        return HubTask(name=Path(dataset.rstrip("/")).name, dataset=dataset, revision=revision, **dev)
    if text.endswith((".toml", ".json")) and Path(text).is_file():
        return build_config(HubTask, {**read_mapping_file(text), **dev}, f"hub task {text}")
    return None


# --- revisions -------------------------------------------------------------------------------


def is_local(dataset: str) -> bool:
    """Whether `dataset` names a local directory (the test `datasets.load_dataset` applies)."""
    return os.path.isdir(dataset)


def local_dataset_revision(path: str | Path) -> str:
    """``sha256:<hex>`` over the relative path and sha256 of every non-hidden file under `path`.

    Files are visited in sorted relative-path order, so the digest depends on names and bytes
    only, not on modification times or where the directory lives.
    """
    root = Path(path)
    if not root.is_dir():
        raise HubTaskError(f"{root}: not a directory")
    digest = hashlib.sha256()
    for relative, file in _visible_files(root):
        digest.update(f"{relative}\0{file_sha256(file)}\n".encode())
    return LOCAL_REVISION_PREFIX + digest.hexdigest()


def resolve_revision(dataset: str, revision: str) -> str:
    """The exact version `revision` names: a commit sha on the Hub, a content digest locally.

    A local directory's revision must be its `local_dataset_revision` (raises otherwise). A
    full 40-hex commit sha is returned as given; a tag or branch is looked up on the Hub.
    """
    if is_local(dataset):
        actual = local_dataset_revision(dataset)
        if revision != actual:
            raise HubTaskError(
                f"local dataset {dataset!r}: revision {revision!r} does not match the directory, "
                f"whose content is now {actual}. For a local directory the revision pins the content "
                "(datasets ignores revisions there): the directory changed since it was pinned, or the "
                "pin is wrong; pin the new digest if the change is intended"
            )
        return actual
    if _COMMIT_SHA.fullmatch(revision):
        return revision
    import huggingface_hub

    try:
        sha = huggingface_hub.HfApi().dataset_info(dataset, revision=revision).sha
    except Exception as error:  # offline, unknown repository or revision, network errors, ...
        raise HubTaskError(
            f"Hugging Face dataset {dataset!r}: cannot resolve revision {revision!r} to a commit "
            f"({type(error).__name__}: {error}); pin a full commit sha to use a cached task offline"
        ) from error
    if not sha:
        raise HubTaskError(f"Hugging Face dataset {dataset!r}: the Hub gave no commit for revision {revision!r}")
    return sha


# --- materialising ---------------------------------------------------------------------------


def load_hub_task(spec: HubTask, cache_dir: str | Path | None = None) -> Task:
    """`materialise_hub_task(spec, cache_dir).task`."""
    return materialise_hub_task(spec, cache_dir).task


def materialise_hub_task(spec: HubTask, cache_dir: str | Path | None = None) -> MaterialisedTask:
    """The task `spec` names, written as a BEIR folder in the cache (once) and loaded back from it.

    `cache_dir` defaults to EMBEDLAB_CACHE (~/.cache/embedlab); the folder is
    ``<cache_dir>/hub-tasks/<key>/<spec.name>``. Raises HubTaskError (or beir's
    TaskFormatError for ids that cannot be written as TSV).
    """
    if cache_dir is None:
        cache_dir = store.cache_dir()
    qrels_dataset, qrels_revision = spec.qrels_source
    resolved = resolve_revision(spec.dataset, spec.revision)
    resolved_qrels = resolved if qrels_dataset == spec.dataset else resolve_revision(qrels_dataset, qrels_revision)
    identity = _identity(spec, resolved, resolved_qrels)
    key = hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    parent = Path(cache_dir) / HUB_TASKS_DIR / key[:24]
    directory = parent / spec.name
    if not directory.exists():
        _materialise(spec, identity, key, resolved, resolved_qrels, parent)
    return _load_materialised(directory)


def _identity(spec: HubTask, resolved: str, resolved_qrels: str) -> dict[str, Any]:
    """What the cache key covers: everything that decides the folder's content, and nothing else."""
    qrels_dataset, _ = spec.qrels_source

    def place(dataset: str) -> str:
        return str(Path(dataset).resolve()) if is_local(dataset) else dataset

    return {
        "layout": LAYOUT_VERSION,
        "corpus": {"dataset": place(spec.dataset), "config": spec.corpus_config, "split": spec.corpus_split,
                   "revision": resolved},
        "queries": {"dataset": place(spec.dataset), "config": spec.queries_config, "split": spec.queries_split,
                    "revision": resolved},
        "qrels": {"dataset": place(qrels_dataset), "config": spec.qrels_config,
                  "splits": list(spec.splits) if spec.splits is not None else None, "revision": resolved_qrels},
        "dev": None if spec.dev_fraction is None else {"fraction": spec.dev_fraction, "seed": spec.dev_seed},
    }


def _materialise(
    spec: HubTask, identity: dict[str, Any], key: str, resolved: str, resolved_qrels: str, parent: Path
) -> None:
    task, rows = read_hub_task(spec, resolved, resolved_qrels)
    dev: DevSplit | None = None
    if spec.dev_fraction is not None:
        task, dev = derive_dev_split(task, spec.dev_fraction, spec.dev_seed)
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".{spec.name}.tmp-{uuid.uuid4().hex}"
    try:
        write_task(task, staging)
        qrels_dataset, qrels_revision = spec.qrels_source
        provenance = {
            "layout": LAYOUT_VERSION,
            "name": spec.name,
            "key": key,
            "identity": identity,
            "dataset": spec.dataset,
            "configs": {"corpus": spec.corpus_config, "queries": spec.queries_config, "qrels": spec.qrels_config},
            "qrels_dataset": qrels_dataset,
            "revision": {"requested": spec.revision, "resolved": resolved},
            "qrels_revision": {"requested": qrels_revision, "resolved": resolved_qrels},
            "revision_meaning": {
                name: ("sha256 of the local directory's files (datasets ignores revisions for local directories)"
                       if is_local(dataset) else "Hugging Face Hub commit sha")
                for name, dataset in (("dataset", spec.dataset), ("qrels_dataset", qrels_dataset))
            },
            "rows_read": rows,
            "task": {
                "documents": len(task.corpus),
                "queries": len(task.queries),
                "judgements": {split: sum(map(len, judged.values())) for split, judged in sorted(task.qrels.items())},
                "judged_queries": {split: len(judged) for split, judged in sorted(task.qrels.items())},
            },
            "dev_split": dev.as_dict() if dev is not None else None,
            "task_hash": task.hash,
            "files": [
                {"path": relative, "bytes": file.stat().st_size, "sha256": file_sha256(file)}
                for relative, file in _visible_files(staging)
            ],
            "datasets_version": _datasets_version(),
        }
        (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n",
                                               encoding="utf-8")
        try:
            staging.rename(parent / spec.name)
        except OSError:
            if not (parent / spec.name / PROVENANCE_FILE).is_file():
                raise
            # Another process materialised the same key first: its folder has the same content.
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _load_materialised(directory: Path) -> MaterialisedTask:
    record_path = directory / PROVENANCE_FILE
    if not record_path.is_file():
        raise HubTaskError(f"{directory}: a cached hub task folder without {PROVENANCE_FILE}; delete it to rebuild")
    provenance = json.loads(record_path.read_text(encoding="utf-8"))
    task = load_task(directory)
    if task.hash != provenance.get("task_hash"):
        raise HubTaskError(
            f"{directory}: the cached task's content hash is {task.hash}, not the {provenance.get('task_hash')} "
            "recorded when it was written: the folder was modified; delete it to rebuild"
        )
    return MaterialisedTask(task=task, directory=directory, provenance=provenance)


# --- reading the dataset ---------------------------------------------------------------------


def read_hub_task(spec: HubTask, resolved: str, resolved_qrels: str) -> tuple[Task, dict[str, Any]]:
    """The task as the dataset holds it, read at the resolved revisions, and the rows read per config.

    Local revisions are not checked here (`resolve_revision` does that); a Hub dataset is read
    at `resolved`, the commit sha.
    """
    corpus_rows, corpus_split = _single_split(spec.dataset, spec.corpus_config, spec.corpus_split, resolved, "corpus")
    corpus = _read_corpus(corpus_rows, _scope(spec.dataset, resolved, spec.corpus_config, corpus_split))
    query_rows, query_split = _single_split(spec.dataset, spec.queries_config, spec.queries_split, resolved, "queries")
    queries = _read_queries(query_rows, _scope(spec.dataset, resolved, spec.queries_config, query_split))
    qrels_dataset, _ = spec.qrels_source
    qrels: dict[str, Qrels] = {}
    qrels_rows: dict[str, int] = {}
    for split, rows in _qrels_splits(qrels_dataset, spec.qrels_config, spec.splits, resolved_qrels):
        qrels[split] = _read_qrels(rows, _scope(qrels_dataset, resolved_qrels, spec.qrels_config, split),
                                   queries, corpus)
        qrels_rows[split] = len(rows)
    counts = {
        "corpus": {"split": corpus_split, "rows": len(corpus_rows)},
        "queries": {"split": query_split, "rows": len(query_rows)},
        "qrels": qrels_rows,
    }
    return Task(name=spec.name, corpus=corpus, queries=queries, qrels=qrels), counts


def _scope(dataset: str, revision: str, config: str, split: str) -> str:
    kind = "local dataset" if is_local(dataset) else "Hugging Face dataset"
    return f"{kind} {dataset!r} at revision {revision!r} config {config!r} split {split!r}"


def _load(dataset: str, config: str, split: str | None, revision: str, features: Any = None) -> Any:
    # Imported here: `datasets` takes seconds to import and only this module's loads need it.
    import datasets

    try:
        return datasets.load_dataset(dataset, name=config, split=split, revision=revision, features=features)
    except Exception as error:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ValueError, ...)
        hint = ""
        if is_local(dataset) and "BuilderConfig" in str(error):
            hint = (" (a local directory's configs come only from the `configs:` block of the YAML header of "
                    "its README.md; see embedlab.tasks.hub_tasks)")
        where = f"{dataset!r} at revision {revision!r} config {config!r}" + (f" split {split!r}" if split else "")
        raise HubTaskError(f"dataset {where}: {type(error).__name__}: {error}{hint}") from error


def _single_split(dataset: str, config: str, split: str | None, revision: str, what: str) -> tuple[Any, str]:
    """(rows, split name) of the `config` split to read: `split`, else the config's only split."""
    if split is not None:
        return _load(dataset, config, split, revision), split
    splits = _load(dataset, config, None, revision)
    if len(splits) != 1:
        raise HubTaskError(
            f"dataset {dataset!r} config {config!r} has splits {sorted(splits)}: set {what}_split to the one "
            f"that holds the {what}"
        )
    (name, rows), = splits.items()
    return rows, str(name)


def _qrels_splits(dataset: str, config: str, splits: tuple[str, ...] | None, revision: str) -> list[tuple[str, Any]]:
    import datasets

    # Cast on read: a CSV/TSV reader would otherwise parse the id "007" as the number 7.
    features = datasets.Features({
        "query-id": datasets.Value("string"), "corpus-id": datasets.Value("string"), "score": datasets.Value("float64"),
    })
    if splits is None:
        loaded = _load(dataset, config, None, revision, features)
        found = [(str(name), rows) for name, rows in sorted(loaded.items())]
        if REQUIRED_SPLIT not in {name for name, _ in found}:
            raise HubTaskError(
                f"dataset {dataset!r} config {config!r} has qrels splits {[name for name, _ in found]} but no "
                f"{REQUIRED_SPLIT!r} split, which every BEIR task needs"
            )
        return found
    return [(split, _load(dataset, config, split, revision, features)) for split in splits]


def _batches(rows: Any, columns: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, row) in dataset order, only `columns` read."""
    number = 0
    for batch in rows.select_columns(columns).iter(batch_size=_READ_BATCH_ROWS):
        for values in zip(*(batch[c] for c in columns)):
            yield number, dict(zip(columns, values))
            number += 1


def _require_columns(rows: Any, scope: str, required: tuple[str, ...]) -> None:
    missing = [c for c in required if c not in rows.column_names]
    if missing:
        raise HubTaskError(f"{scope}: no column {', '.join(map(repr, missing))}; columns: {', '.join(rows.column_names)}")


def _identifier(scope: str, number: int, column: str, value: object) -> str:
    """An id as a string: integer ids (as Parquet or JSON may store them) become their decimal text."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise HubTaskError(f"{scope} row {number}: {column} {value!r} is not a string")
    text = str(value)
    if not text:
        raise HubTaskError(f"{scope} row {number}: {column} is empty")
    return text


def _text(scope: str, number: int, column: str, value: object) -> str:
    if not isinstance(value, str):
        raise HubTaskError(f"{scope} row {number}: {column} must be a string, got {value!r}")
    return value


def _read_corpus(rows: Any, scope: str) -> dict[str, tuple[str, str]]:
    _require_columns(rows, scope, ("_id", "text"))
    columns = ["_id", "text"] + (["title"] if "title" in rows.column_names else [])
    corpus: dict[str, tuple[str, str]] = {}
    first: dict[str, int] = {}
    for number, row in _batches(rows, columns):
        doc_id = _unique(scope, number, _identifier(scope, number, "_id", row["_id"]), first)
        title = row.get("title")
        corpus[doc_id] = ("" if title is None else _text(scope, number, "title", title),
                          _text(scope, number, "text", row["text"]))
    if not corpus:
        raise HubTaskError(f"{scope}: the corpus is empty")
    return corpus


def _read_queries(rows: Any, scope: str) -> dict[str, str]:
    _require_columns(rows, scope, ("_id", "text"))
    queries: dict[str, str] = {}
    first: dict[str, int] = {}
    for number, row in _batches(rows, ["_id", "text"]):
        qid = _unique(scope, number, _identifier(scope, number, "_id", row["_id"]), first)
        queries[qid] = _text(scope, number, "text", row["text"])
    if not queries:
        raise HubTaskError(f"{scope}: no queries")
    return queries


def _unique(scope: str, number: int, record_id: str, first: dict[str, int]) -> str:
    if record_id in first:
        raise HubTaskError(f"{scope} row {number}: duplicate _id {record_id!r} (first in row {first[record_id]})")
    first[record_id] = number
    return record_id


def _read_qrels(rows: Any, scope: str, queries: Mapping[str, str], corpus: Mapping[str, tuple[str, str]]) -> Qrels:
    _require_columns(rows, scope, QRELS_HEADER)
    qrels: Qrels = {}
    for number, row in _batches(rows, list(QRELS_HEADER)):
        qid = _identifier(scope, number, "query-id", row["query-id"])
        doc_id = _identifier(scope, number, "corpus-id", row["corpus-id"])
        score = row["score"]
        if qid not in queries:
            raise HubTaskError(f"{scope} row {number}: query-id {qid!r} is not in the queries")
        if doc_id not in corpus:
            raise HubTaskError(f"{scope} row {number}: corpus-id {doc_id!r} is not in the corpus")
        if score is None or not math.isfinite(score) or score != int(score):
            raise HubTaskError(f"{scope} row {number}: score {score!r} for ({qid!r}, {doc_id!r}) is not a whole number")
        judgements = qrels.setdefault(qid, {})
        if doc_id in judgements:
            raise HubTaskError(f"{scope} row {number}: duplicate judgement for ({qid!r}, {doc_id!r})")
        judgements[doc_id] = int(score)
    if not qrels:
        raise HubTaskError(f"{scope}: no judgements")
    return qrels


# --- a dev split -----------------------------------------------------------------------------


def dev_query_ids(train_query_ids: Iterable[str], fraction: float, seed: int) -> tuple[str, ...]:
    """The train queries `DEV_RULE` moves to dev, sorted by id.

    Each query's place depends only on its id and the seed, so the choice does not depend on
    the order the ids come in.
    """
    check_fraction("dev split", fraction)
    ids = sorted(set(train_query_ids))
    count = math.floor(fraction * len(ids) + 0.5)
    if not 1 <= count <= len(ids) - 1:
        raise HubTaskError(
            f"dev split: a fraction of {fraction} of {len(ids)} train queries is {count} queries; both dev and "
            "train need at least one"
        )

    def rank(qid: str) -> tuple[bytes, str]:
        return hashlib.sha256(f"{seed}:{qid}".encode()).digest(), qid

    return tuple(sorted(sorted(ids, key=rank)[:count]))


def derive_dev_split(task: Task, fraction: float, seed: int) -> tuple[Task, DevSplit]:
    """`task` with a dev split made from its train qrels (`DEV_RULE`), and the record of it.

    A task that already has dev qrels is returned unchanged (origin "dataset"): the derived
    split is a fallback for tasks without one. Raises HubTaskError for a task with neither
    dev nor train qrels. Deterministic: the same task, fraction and seed give the same split.
    """
    if DEV_SPLIT in task.qrels:
        check_fraction(f"task {task.name!r}", fraction)
        train = task.qrels.get(TRAIN_SPLIT, {})
        return task, DevSplit("dataset", None, None, tuple(sorted(task.qrels[DEV_SPLIT])), len(train))
    if TRAIN_SPLIT not in task.qrels:
        raise HubTaskError(
            f"task {task.name!r} has neither {DEV_SPLIT!r} nor {TRAIN_SPLIT!r} qrels (only {sorted(task.qrels)}): "
            "there is nothing to make a dev split from, and the test split must stay untouched"
        )
    train = task.qrels[TRAIN_SPLIT]
    moved = dev_query_ids(list(train), fraction, seed)
    chosen = set(moved)
    qrels = {
        **task.qrels,
        TRAIN_SPLIT: {qid: judged for qid, judged in train.items() if qid not in chosen},
        DEV_SPLIT: {qid: train[qid] for qid in moved},
    }
    return replace(task, qrels=qrels), DevSplit("derived", fraction, seed, moved, len(train))


# --- helpers ---------------------------------------------------------------------------------


def _visible_files(root: Path) -> list[tuple[str, Path]]:
    """(relative posix path, file) of the files under `root` with no hidden path component, sorted."""
    found = []
    for file in root.rglob("*"):
        relative = file.relative_to(root)
        if file.is_file() and not any(part.startswith(".") for part in relative.parts):
            found.append((relative.as_posix(), file))
    return sorted(found)


def _datasets_version() -> str:
    import datasets

    return datasets.__version__

