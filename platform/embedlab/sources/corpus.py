"""Build the frozen corpus: read sources, deduplicate, split by group, record provenance.

Order of operations (the recipe's "deduplicate before splitting/chunking"):
1. read every configured source in full (built-in sources, then local files and
   Hugging Face datasets);
2. exact dedup: documents whose normalised-text hash was already seen are dropped
   (first occurrence kept, in source order) and counted in the exclusion report;
3. near-duplicate clustering (MinHash + LSH over word 5-grams, `data.dedup`): every
   document gets a `group_id`, the smallest doc id of its cluster (mining's same-group rule
   reads it);
4. split groups: near-duplicate clusters joined with source groups (the documents a source
   cut from one page, one module: `Document.group`) into connected components, each named
   `split_group` by its smallest doc id;
5. split by split group: train / dev (recipe-dev) / test (final-eval) is a pure function
   of the split group and the split seed, so no cluster, page or module straddles two
   splits. A document in no cluster and no source group is its own split group, so its
   split does not depend on what else is read.

Output directory:
    documents.parquet   doc_id, source, title, text, hash, group_id, split_group, split,
                        language, domain
    sources.parquet     one provenance row per source
    manifest.json       provenance, dedup versions, retained counts, exclusions, corpus hash
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.core.code_identity import VERSION
from embedlab.core.config import DataConfig
from embedlab.core.errors import UsageError
from embedlab.sources import builtin
from embedlab.sources.dedup import connected_components, near_duplicate_clusters
from embedlab.sources.document import Document
from embedlab.sources.external import HFDataset, LocalFiles, ReadStats, external_provenance, iter_external
from embedlab.sources.mixture import PHASE1_FAMILIES
from embedlab.sources.rights import rights_for_builtin

SPLITS = ("train", "dev", "test")
FORMAT = "embedlab-corpus/2"
EXACT_DEDUP_VERSION = "exact/1: sha256 of NFKC, whitespace-collapsed text; first occurrence kept"
NEAR_DEDUP_VERSION = ("minhash-lsh/2: accent-folded word 5-grams, 128 permutations, bands for recall 0.95 at the "
                      "threshold, verified by exact Jaccard")
SPLIT_GROUP_VERSION = "split-groups/1: near-duplicate clusters joined with source groups (page, module)"
BUILTIN_FILTERING = (
    f"builtin-readers/{VERSION}: docstrings >= {builtin.MIN_DOCSTRING_CHARS} characters; HTML sections "
    f">= {builtin.MIN_SECTION_CHARS} characters, pages split above {builtin.MAX_PAGE_CHARS}; empty entries skipped"
)
COLUMNS = ("doc_id", "source", "title", "text", "hash", "group_id", "split_group", "split", "language", "domain")


def split_of(group_id: str, config: DataConfig) -> str:
    """train / dev / test from a uniform number derived from the group id and the split seed."""
    digest = hashlib.sha256(f"{config.split_seed}:{group_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < config.dev_fraction:
        return "dev"
    if u < config.dev_fraction + config.test_fraction:
        return "test"
    return "train"


def domain_of(source: str) -> str:
    for family, sources in PHASE1_FAMILIES.items():
        if source in sources:
            return family
    return "unassigned"


def resolve_sources(config: DataConfig) -> list[str]:
    """The configured built-in sources, or every available one; unknown or missing names are errors."""
    status = builtin.source_status()
    if not config.sources:
        names = builtin.available_sources()
        if not names:
            raise FileNotFoundError("no built-in source is available on this machine")
        return names
    unknown = [n for n in config.sources if n not in status]
    if unknown:
        raise UsageError(f"data.sources: unknown {unknown}; valid: {list(builtin.SOURCE_NAMES)}")
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
    """Read every configured source in full, dedup, split by group and write `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = resolve_sources(config)
    seen: set[str] = set()
    kept: list[Document] = []
    provenance: dict[str, dict] = {}
    exclusions: list[dict] = []
    readers = [(name, builtin.iter_documents(name), _builtin_provenance(name), None) for name in names]
    for source in (*config.local_files, *config.hf_datasets):
        if source.name in builtin.SOURCE_NAMES:
            raise UsageError(f"external source name {source.name!r} is a built-in source's name")
        stats = ReadStats()
        readers.append((source.name, iter_external(source, stats=stats), _external_provenance(source), stats))
    for name, documents, record, stats in readers:
        started = time.perf_counter()
        read = duplicates = 0
        for doc in documents:
            read += 1
            if doc.hash in seen:
                duplicates += 1
                continue
            seen.add(doc.hash)
            kept.append(doc)
        provenance[name] = {**record, "documents_read": read}
        if duplicates:
            exclusions.append({"source": name, "reason": "exact duplicate of an earlier document", "count": duplicates})
        if stats is not None:
            provenance[name]["read_stats"] = stats.as_dict()
            exclusions += [{"source": name, "reason": reason, "count": count} for reason, count in stats.skipped.items()]
        progress(f"  corpus: {name:<18} {read:>7} documents, {duplicates} exact duplicates dropped "
                 f"({time.perf_counter() - started:.1f}s)")
    for name, why in builtin.source_status().items():
        if why is not None and not config.sources:
            progress(f"  corpus: {name:<18} skipped: {why}")
    started = time.perf_counter()
    groups = near_duplicate_clusters(
        [d.doc_id for d in kept], [d.text for d in kept], threshold=config.near_duplicate_threshold
    )
    rows = _rows(kept, groups, config)
    cluster_stats = _cluster_stats(rows)
    progress(f"  corpus: near-duplicate clusters: {cluster_stats['multi_document_clusters']:,} with "
             f"{cluster_stats['documents_in_multi_document_clusters']:,} documents "
             f"({time.perf_counter() - started:.1f}s)")
    for name in provenance:
        provenance[name]["retained"] = {
            split: sum(1 for s, p in zip(rows["source"], rows["split"]) if s == name and p == split)
            for split in SPLITS
        }
    pq.write_table(pa.table(rows), directory / "documents.parquet")
    pq.write_table(
        pa.table({
            "source": list(provenance),
            "provenance": [json.dumps(p, sort_keys=True) for p in provenance.values()],
        }),
        directory / "sources.parquet",
    )
    manifest = {
        "format": FORMAT,
        "config": {
            "split_seed": config.split_seed,
            "dev_fraction": config.dev_fraction,
            "test_fraction": config.test_fraction,
            "near_duplicate_threshold": config.near_duplicate_threshold,
        },
        "dedup": {"exact": EXACT_DEDUP_VERSION, "near": NEAR_DEDUP_VERSION, **cluster_stats},
        "split_groups": {"rule": SPLIT_GROUP_VERSION, **_split_group_stats(rows)},
        "split_rule": "sha256(split_seed:split_group) -> uniform; < dev_fraction dev, < dev+test test, else train",
        "sources": provenance,
        "exclusions": exclusions,
        "unavailable_sources": {n: why for n, why in builtin.source_status().items() if why is not None},
        "hash": _corpus_hash(rows),
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return Corpus(directory=directory, manifest=manifest)


def _builtin_provenance(name: str) -> dict:
    return {
        "source": name,
        "acquisition": "debian-package" if builtin.debian_package(name) else "python-installation",
        "revision": builtin.source_revision(name),
        "debian_package": builtin.debian_package(name),
        "language": "en",
        "domain": domain_of(name),
        "rights": rights_for_builtin(name),
        "filtering": BUILTIN_FILTERING,
    }


def _external_provenance(source: LocalFiles | HFDataset) -> dict:
    return {
        "source": source.name,
        **external_provenance(source),
        "language": "en (declared by the built-in default; not detected)",
        "domain": domain_of(source.name),
        "rights": {"notes": "external source: rights and attribution are the user's to record"},
    }


def load_corpus(directory: Path) -> Corpus:
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file() or not (directory / "documents.parquet").is_file():
        raise FileNotFoundError(f"no built corpus in {directory} (manifest.json + documents.parquet)")
    return Corpus(directory=directory, manifest=json.loads(manifest_path.read_text()))


def split_groups(documents: list[Document], clusters: dict[str, str]) -> dict[str, str]:
    """doc id -> its split group: the smallest doc id of its connected component when
    documents sharing a near-duplicate cluster (`clusters`) or a source group are linked."""
    ids = sorted(d.doc_id for d in documents)
    row = {doc_id: k for k, doc_id in enumerate(ids)}
    left, right = [], []
    first_of: dict[str, int] = {}
    for doc in documents:
        left.append(row[doc.doc_id])
        right.append(row[clusters[doc.doc_id]])
        if doc.group:
            left.append(row[doc.doc_id])
            right.append(first_of.setdefault(doc.group, row[doc.doc_id]))
    label = connected_components(len(ids), np.array(left, dtype=np.int64), np.array(right, dtype=np.int64))
    return {doc_id: ids[label[k]] for k, doc_id in enumerate(ids)}


def _rows(documents: list[Document], groups: dict[str, str], config: DataConfig) -> dict[str, list]:
    rows: dict[str, list] = {column: [] for column in COLUMNS}
    split_group = split_groups(documents, groups)
    for doc in documents:
        group = groups[doc.doc_id]
        rows["doc_id"].append(doc.doc_id)
        rows["source"].append(doc.source)
        rows["title"].append(doc.title)
        rows["text"].append(doc.text)
        rows["hash"].append(doc.hash)
        rows["group_id"].append(group)
        rows["split_group"].append(split_group[doc.doc_id])
        rows["split"].append(split_of(split_group[doc.doc_id], config))
        rows["language"].append("en")
        rows["domain"].append(domain_of(doc.source))
    return rows


def _cluster_stats(rows: dict[str, list]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    sources: dict[str, set[str]] = {}
    for group, source in zip(rows["group_id"], rows["source"]):
        sizes[group] = sizes.get(group, 0) + 1
        sources.setdefault(group, set()).add(source)
    multi = [g for g, n in sizes.items() if n > 1]
    return {
        "clusters": len(sizes),
        "multi_document_clusters": len(multi),
        "documents_in_multi_document_clusters": sum(sizes[g] for g in multi),
        "cross_source_clusters": sum(1 for g in multi if len(sources[g]) > 1),
    }


def _split_group_stats(rows: dict[str, list]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for group in rows["split_group"]:
        sizes[group] = sizes.get(group, 0) + 1
    return {"split_groups": len(sizes), "multi_document_split_groups": sum(1 for n in sizes.values() if n > 1),
            "largest_split_group": max(sizes.values(), default=0)}


def _corpus_hash(rows: dict[str, list]) -> str:
    digest = hashlib.sha256()
    for key in sorted(zip(rows["doc_id"], rows["hash"], rows["group_id"], rows["split_group"], rows["split"])):
        digest.update("\t".join(key).encode())
        digest.update(b"\n")
    return digest.hexdigest()
