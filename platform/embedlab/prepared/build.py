"""From sources to a frozen training stream: corpus -> tokenizer -> pieces -> evaluation task.

Everything a study's trials share is prepared once, before any trial starts, in a
directory named by the hash of the data config, the source revisions and the code that
builds it (`BUILD_SOURCES`), so repeated runs reuse it, two configs never share one by
accident, and changed preparation code prepares afresh. The directory is written under a
staging name of its own writer and renamed when complete, so a half-built one is never used.

    corpus/              documents.parquet + manifest.json (see data.corpus)
    tokenizer_sample.parquet   ids of the training-split documents the tokenizer saw
    tokenizer.json       trained on that sample only (or a pretrained parent's own, copied:
                         `data.tokenizer_kind` "pretrained"; its sample is then empty)
    pieces.parquet       training documents tokenised into pieces of <= L tokens (Ray Data)
    tasks/<name>/        the built-in retrieval task in BEIR format
    retention/           the retention panel (probe passages, graded pairs) from recipe-dev text
    prepared.json        hashes, resolved mixture, tokens and truncation per source
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.contamination.audit import audit
from embedlab.prepared.audits import task_audit
from embedlab.artifacts.build import Artifact, build_once
from embedlab.core import store
from embedlab.core.store import file_sha256
from embedlab.core.code_identity import code_revision
from embedlab.core.beir import write_task
from embedlab.core.config import PRETRAINED_TOKENIZER, DataConfig
from embedlab.core.errors import UsageError, UserError
from embedlab.prepared.card import card_dict, write_card
from embedlab.prepared.directory import PreparedData
from embedlab.sources import builtin
from embedlab.sources.corpus import Corpus, build_corpus, resolve_sources
from embedlab.sources.document import document_text
from embedlab.sources.external import external_provenance
from embedlab.sources.mixture import resolve_mixture
from embedlab.prepared.pieces import PIECES_FILE, build_pieces, piece_stats
from embedlab.tasks.builtin_tasks import BUILTIN_TASKS, build_builtin_task, decontaminate
from embedlab.tokenizer.frozen import (FILE_NAME as TOKENIZER_FILE, FrozenTokenizer, describe, load_tokenizer,
                                       save_tokenizer, stored_tokenizer, train_tokenizer)

FORMAT = "embedlab-prepared/4"  # the human-readable part of the key; `code_revision` is the rest
# The package's source files whose code decides the prepared bytes (corpus, tokenizer, pieces,
# tasks, retention panel, the audits and the card), relative to the package root. Their
# content is part of the cache key, so a change to any of them prepares afresh instead of
# reusing a directory that older code built.
BUILD_SOURCES = (
    "prepared/build.py", "prepared/directory.py", "sources/corpus.py", "sources/builtin.py", "sources/document.py",
    "sources/dedup.py", "sources/external.py", "core/config/sources.py", "sources/rights.py", "sources/mixture.py",
    "streams/packed.py", "streams/packing.py", "contamination/audit.py", "contamination/gate.py", "contamination/saved.py",
    "contamination/stages.py", "prepared/card.py", "tokenizer/frozen.py", "core/beir.py", "tasks/builtin_tasks.py",
    "tasks/retention.py",
)


# What a prepared directory with a pretrained parent's tokenizer says of its (empty) tokenizer
# sample: the contamination audit's tokenizer-sample stage has nothing of ours to read.
PRETRAINED_SAMPLE = ("not applicable: the pretrained parent's own tokenizer, trained on its own data, which the "
                     "audit cannot reach; the tokenizer-sample stage is empty")


@functools.cache
def build_code_revision() -> str:
    """`code_revision` of this installation's `BUILD_SOURCES`, computed once per process."""
    return code_revision(BUILD_SOURCES)


def prepared_artifact(config: DataConfig, code: str | None = None) -> Artifact:
    """The prepared directory of `config` as an artifact: the format, the config and the source
    revisions decide its bytes, with the code that builds them (`BUILD_SOURCES`; `code`, a
    revision of another copy of that code, in its place)."""
    names = resolve_sources(config)
    external = {s.name: external_provenance(s)["revision"] for s in (*config.local_files, *config.hf_datasets)}
    inputs = {
        "format": FORMAT,
        # Without the pair sources: they decide no byte of the directory (a user's pairs are
        # frozen inside it per source content, `embedlab.pairs.user`), so a phase-3 study
        # that adds its own pairs reuses its phase-1 parent's directory and tokenizer.
        "config": config.phase1_dict(),
        "sources": {n: builtin.source_revision(n) for n in names} | external,
    }
    return Artifact(kind="prepared", inputs=inputs, code=BUILD_SOURCES, revision=code)


def prepare_key(config: DataConfig, code: str | None = None) -> str:
    """The key of `config`'s prepared directory (`prepared_artifact`), its name's part after `prepared-`."""
    return prepared_artifact(config, code).name


def prepare_data(
    config: DataConfig,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] = print,
) -> PreparedData:
    """Prepare (or reuse) the data directory for `config`, built once (`embedlab.artifacts.build`).
    Not shared on its own: the sweep publishes it, with what trials add to it, to every node."""
    cache_dir = Path(cache_dir) if cache_dir is not None else store.cache_dir()
    directory = cache_dir / f"prepared-{prepare_key(config)}"
    record_path = directory / "prepared.json"
    if record_path.is_file():
        progress(f"data: reusing {directory}")
        return PreparedData(directory=directory, record=json.loads(record_path.read_text()))
    progress(f"data: preparing {directory}")
    keep_ray_data_off_the_console()

    def build(staging: Path) -> None:
        record = _prepare_into(config, staging, progress)
        (staging / "prepared.json").write_text(json.dumps(record, indent=2, sort_keys=True))
        _audit_and_card(PreparedData(directory=staging, record=record), progress)

    build_once(directory, build, shared=False, progress=progress)
    return PreparedData(directory=directory, record=json.loads(record_path.read_text()))


def keep_ray_data_off_the_console() -> None:
    """Keep Ray Data's own lines (execution plans and the progress it logs at INFO when stdout
    is no terminal, its progress bars when it is) off the console, which carries embedlab's
    progress lines; they stay in Ray's log files (`<session>/logs/ray-data/`). Errors still
    reach the console. A `RAY_DATA_LOGGING_CONFIG` of the user's own is left alone. For the
    driver (a worker's output is not forwarded to it); calling it again changes nothing."""
    import logging

    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    if os.environ.get("RAY_DATA_LOGGING_CONFIG"):
        return
    for handler in logging.getLogger("ray.data").handlers:
        # Ray Data's console handler is its one stream handler that writes no file.
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.ERROR)


def _prepare_into(config: DataConfig, directory: Path, progress: Callable[[str], None]) -> dict:
    started = time.perf_counter()
    corpus = build_corpus(config, directory / "corpus", progress)
    mixture = resolve_mixture(config.mixture.share_map, list(corpus.manifest["sources"]))
    pretrained = config.tokenizer_kind == PRETRAINED_TOKENIZER
    if pretrained:
        sample = {"doc_id": []}
        tokenizer = _pretrained_tokenizer(config, directory, progress)
    else:
        sample = _tokenizer_sample(corpus, list(mixture.shares), config)
    pq.write_table(pa.table({"doc_id": pa.array(sample["doc_id"], pa.string())}),
                   directory / "tokenizer_sample.parquet")
    if not pretrained:
        progress(f"data: training tokenizer ({config.tokenizer_kind}, vocab {config.tokenizer_vocab_size}) "
                 f"on {len(sample['doc_id']):,} training-split documents")
        texts = [document_text(t, x) for t, x in zip(sample["title"], sample["text"])]
        tokenizer = save_tokenizer(
            train_tokenizer(texts, config.tokenizer_vocab_size, kind=config.tokenizer_kind,
                            progress=lambda line: progress(f"data: {line}")), directory
        )
    progress("data: tokenising training documents into pieces on Ray Data")
    step = time.perf_counter()
    pieces = build_pieces(
        corpus.documents_path, tokenizer.path, sequence_length=config.sequence_length,
        sources=list(mixture.shares), out_path=directory / PIECES_FILE, progress=progress,
    )
    progress(f"data: pieces written in {time.perf_counter() - step:.1f}s")
    tasks = _build_tasks(corpus, directory / "tasks", config, progress)
    # Here: the retention module imports torch, which nothing else preparing data (nor a Ray
    # Data task importing this module) needs.
    from embedlab.tasks.retention import build_panel

    progress("data: building the retention panel")
    retention = build_panel(corpus.read(), directory / "retention")
    progress(f"data: retention panel: {retention}")
    progress(f"data: prepared in {time.perf_counter() - started:.1f}s")
    return {
        "format": FORMAT,
        "code_revision": build_code_revision(),
        "config": config.phase1_dict(),
        "corpus_hash": corpus.hash,
        "tokenizer_hash": tokenizer.hash,
        "tokenizer": {**describe(tokenizer.tokenizer, pretrained=True), "sample": PRETRAINED_SAMPLE}
        if pretrained else describe(tokenizer.tokenizer),
        "tokenizer_vocab_size": tokenizer.vocab_size,
        "tokenizer_sample_documents": len(sample["doc_id"]),
        "data_revision": hashlib.sha256(
            f"{corpus.hash}:{tokenizer.hash}:{file_sha256(directory / PIECES_FILE)}".encode()
        ).hexdigest(),
        "sequence_length": config.sequence_length,
        "mixture": {
            "shares": mixture.shares,
            "origin": mixture.origin,
            "notes": list(mixture.notes),
            "max_epochs": config.mixture.max_epochs,
            "schedule": config.mixture.schedule,
            "seed": config.mixture.seed,
        },
        "pieces": piece_stats(pieces, config.sequence_length),
        "tasks": tasks,
        "retention": retention,
    }


def _pretrained_tokenizer(config: DataConfig, directory: Path, progress: Callable[[str], None]) -> FrozenTokenizer:
    """A pretrained parent's frozen tokenizer, found by the hash the config names (kept on this
    node when the parent was materialised), copied in as the directory's own."""
    source = stored_tokenizer(config.tokenizer_hash)
    if not source.is_file():
        raise UsageError(f"data.tokenizer_hash {config.tokenizer_hash[:16]}: no pretrained tokenizer of that hash on "
                         f"this node ({source.parent.parent}); it is kept when its parent is materialised "
                         "(embedlab sweep --parent hf:ORG/NAME@<commit> or a model directory)")
    progress(f"data: the pretrained parent's tokenizer ({config.tokenizer_hash[:12]}), not trained: its own "
             "training data is not ours, so there is no tokenizer sample to audit")
    (directory / TOKENIZER_FILE).write_bytes(source.read_bytes())
    return load_tokenizer(directory / TOKENIZER_FILE, expected_hash=config.tokenizer_hash)


def _build_tasks(corpus: Corpus, directory: Path, config: DataConfig, progress: Callable[[str], None]) -> dict:
    """Build each built-in task the corpus can make, decontaminated against all training-split text."""
    built: dict[str, dict] = {}
    for name in BUILTIN_TASKS:
        if name not in corpus.manifest["sources"]:
            continue
        progress(f"data: building task {name} and removing what the training split contains")
        task = build_builtin_task(name, corpus)
        train = corpus.read(split="train").select(["doc_id", "title", "text"]).to_pydict()
        stage = ((d, document_text(t, x)) for d, t, x in zip(train["doc_id"], train["title"], train["text"]))
        report = audit([task], {"training-split": stage}, threshold=config.near_duplicate_threshold, progress=None)
        task, summary = decontaminate(task, report.findings)
        write_task(task, directory / name)
        (directory / name / "decontamination.json").write_text(json.dumps(summary, indent=2))
        progress(f"data: built task {name}: {len(task.corpus)} documents, {summary['queries_kept']} queries "
                 f"per split ({len(summary['queries_removed'])} queries, {len(summary['documents_removed'])} "
                 "documents removed: found in training-split text)")
        built[name] = {"hash": task.hash, "queries": summary["queries_kept"], "documents": len(task.corpus),
                       "queries_removed": len(summary["queries_removed"]),
                       "documents_removed": len(summary["documents_removed"])}
    return built


def _audit_and_card(prepared: PreparedData, progress: Callable[[str], None]) -> None:
    """Audit the phase-1 stages against each built task, then write the data card."""
    audits = {
        task_dir.name: task_audit(prepared, task_dir, progress)
        for task_dir in sorted((prepared.directory / "tasks").glob("*"))
    }
    user_pairs = {path.parent.name: json.loads(path.read_text())
                  for path in sorted((prepared.directory / "user-pairs").glob("*/record.json"))}
    write_card(prepared.directory, card_dict(prepared.record, prepared.corpus.manifest, audits, user_pairs))


CARD_FILES = ("data_card.json", "data_card.md")


@contextlib.contextmanager
def undone_on_refusal(directories: Iterable[Path], progress: Callable[[str], None] = print) -> Iterator[None]:
    """A block whose refusal (a UserError) leaves no trace in the shared prepared `directories`:
    what it built there (a frozen user-pairs set, a pairs table, a saved audit: any entry of the
    directory, or of a folder in it, that was not there before) is removed, and the data card
    is put back as it was. The refused run's data never reaches the card another run reads.
    A set another process built in the same moment is removed with it; it is rebuilt on use."""
    before = {Path(d): (_entries(Path(d)), {n: _bytes(Path(d) / n) for n in CARD_FILES}) for d in directories}
    try:
        yield
    except UserError:
        for directory, (entries, cards) in before.items():
            added = sorted(_entries(directory) - entries, key=lambda e: -len(e.parts))
            for entry in added:  # the deepest first, each with the lock `build_once` left beside it
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink(missing_ok=True)
                (entry.parent / f".{entry.name}.lock").unlink(missing_ok=True)
            for name, data in cards.items():
                if data is None:
                    (directory / name).unlink(missing_ok=True)
                else:
                    (directory / name).write_bytes(data)
            if added:
                progress(f"data: the refused run's {len(added)} new entries in {directory} removed, its data card kept")
        raise


def _entries(directory: Path) -> set[Path]:
    """The entries of `directory` and of every folder in it, hidden ones (locks, staging) left out."""
    found: set[Path] = set()
    if not directory.is_dir():
        return found
    for entry in directory.iterdir():
        if entry.name.startswith("."):
            continue
        found.add(entry)
        if entry.is_dir():
            found |= {inner for inner in entry.iterdir() if not inner.name.startswith(".")}
    return found


def _bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def refresh_card(prepared: PreparedData, progress: Callable[[str], None] = print) -> None:
    """Write the data card again, now with every user pair set frozen in the directory
    (`embedlab.pairs.user`); the audits are read from their saved reports. A directory
    without a card (none `prepare_data` wrote) is left as it is."""
    if (prepared.directory / "data_card.json").is_file():
        _audit_and_card(prepared, progress)


def _tokenizer_sample(corpus: Corpus, sources: list[str], config: DataConfig) -> dict[str, list]:
    """Training-split documents of the mixture's sources, an equal number per source.

    Each source contributes the documents with the smallest content hashes: a
    deterministic sample that favours neither the start of a source nor the largest one.
    """
    table = corpus.read(split="train", sources=sources).sort_by(
        [("source", "ascending"), ("hash", "ascending")]
    )
    per_source = max(1, config.tokenizer_sample_documents // max(len(sources), 1))
    columns = table.select(["doc_id", "source", "title", "text"]).to_pydict()
    kept: dict[str, list] = {"doc_id": [], "title": [], "text": []}
    taken: dict[str, int] = {}
    for doc_id, source, title, text in zip(columns["doc_id"], columns["source"], columns["title"], columns["text"]):
        if taken.get(source, 0) >= per_source:
            continue
        taken[source] = taken.get(source, 0) + 1
        kept["doc_id"].append(doc_id)
        kept["title"].append(title)
        kept["text"].append(text)
    return kept
