"""Build the frozen corpus: read sources, drop exact duplicates, split, record provenance.

Exact duplicates (same normalised-text hash) are removed before splitting, and the split
of a document is a pure function of its content hash and the split seed, so a text can
never sit in two splits and the same text always lands in the same split whatever other
sources are read. Documents of every split are kept; training reads `train` only.

Output directory:
    documents.parquet   doc_id, source, title, text, hash, split
    manifest.json       sources and their revisions, counts per split, exclusions, hash
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.config import DataConfig
from embedlab.data import builtin
from embedlab.data.document import Document

SPLITS = ("train", "dev", "test")
FORMAT = "embedlab-corpus/1"


def split_of(content_hash: str, config: DataConfig) -> str:
    """train / dev / test from a uniform number derived from the hash and the split seed."""
    digest = hashlib.sha256(f"{config.split_seed}:{content_hash}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < config.dev_fraction:
        return "dev"
    if u < config.dev_fraction + config.test_fraction:
        return "test"
    return "train"


def resolve_sources(config: DataConfig) -> list[str]:
    """The configured sources, or every available one; unknown or missing names are errors."""
    status = builtin.source_status()
    if not config.sources:
        names = builtin.available_sources()
        if not names:
            raise FileNotFoundError("no built-in source is available on this machine")
        return names
    unknown = [n for n in config.sources if n not in status]
    if unknown:
        raise ValueError(f"data.sources: unknown {unknown}; valid: {list(builtin.SOURCE_NAMES)}")
    missing = {n: status[n] for n in config.sources if status[n] is not None}
    if missing:
        raise FileNotFoundError(f"data.sources not available: {missing}")
    return list(config.sources)


@dataclass(frozen=True)
class Corpus:
    """A built corpus on disk."""

    directory: Path
    manifest: dict

    @property
    def hash(self) -> str:
        return self.manifest["hash"]

    @property
    def documents_path(self) -> Path:
        return self.directory / "documents.parquet"

    def read(self, split: str | None = None, sources: list[str] | None = None) -> pa.Table:
        filters = []
        if split is not None:
            filters.append(("split", "=", split))
        if sources is not None:
            filters.append(("source", "in", sources))
        return pq.read_table(self.documents_path, filters=filters or None)


def build_corpus(
    config: DataConfig, directory: Path, progress: Callable[[str], None] = print
) -> Corpus:
    """Read every configured source in full, dedup, split and write `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = resolve_sources(config)
    seen: set[str] = set()
    rows: dict[str, list] = {k: [] for k in ("doc_id", "source", "title", "text", "hash", "split")}
    sources: dict[str, dict] = {}
    for name in names:
        started = time.perf_counter()
        read = duplicates = 0
        counts = dict.fromkeys(SPLITS, 0)
        for doc in builtin.iter_documents(name):
            read += 1
            if doc.hash in seen:
                duplicates += 1
                continue
            seen.add(doc.hash)
            split = split_of(doc.hash, config)
            counts[split] += 1
            _append(rows, doc, split)
        sources[name] = {
            "revision": builtin.source_revision(name),
            "debian_package": builtin.debian_package(name),
            "documents_read": read,
            "exact_duplicates_dropped": duplicates,
            "retained": counts,
        }
        progress(
            f"  corpus: {name:<18} {read:>7} documents, {duplicates} exact duplicates dropped "
            f"({time.perf_counter() - started:.1f}s)"
        )
    for name, why in builtin.source_status().items():
        if why is not None:
            progress(f"  corpus: {name:<18} skipped: {why}")
    table = pa.table(rows)
    pq.write_table(table, directory / "documents.parquet")
    manifest = {
        "format": FORMAT,
        "config": {
            "split_seed": config.split_seed,
            "dev_fraction": config.dev_fraction,
            "test_fraction": config.test_fraction,
        },
        "dedup": "exact: sha256 of NFKC, whitespace-collapsed text; first occurrence kept",
        "sources": sources,
        "unavailable_sources": {
            n: why for n, why in builtin.source_status().items() if why is not None
        },
        "hash": _corpus_hash(rows),
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return Corpus(directory=directory, manifest=manifest)


def load_corpus(directory: Path) -> Corpus:
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file() or not (directory / "documents.parquet").is_file():
        raise FileNotFoundError(f"no built corpus in {directory} (manifest.json + documents.parquet)")
    return Corpus(directory=directory, manifest=json.loads(manifest_path.read_text()))


def _append(rows: dict[str, list], doc: Document, split: str) -> None:
    rows["doc_id"].append(doc.doc_id)
    rows["source"].append(doc.source)
    rows["title"].append(doc.title)
    rows["text"].append(doc.text)
    rows["hash"].append(doc.hash)
    rows["split"].append(split)


def _corpus_hash(rows: dict[str, list]) -> str:
    digest = hashlib.sha256()
    for key in sorted(zip(rows["doc_id"], rows["hash"], rows["split"])):
        digest.update("\t".join(key).encode())
        digest.update(b"\n")
    return digest.hexdigest()
