"""Mining's search, stored once: every pair's top-k candidates with their scores and the positive's.

A `Candidates` (`embedlab.negatives.mining.search_candidates`) is what the parent encoder and the
exact search found, before any rule. Saved under `mining-candidates/<version>/`, it is what
every rule selects from (`embedlab.negatives.mining.selected_set`), so a study that varies the
rule (margin, relative, rank window, sampled or top) encodes and searches once:

    queries.parquet     one row per pair: pair_id, positive_score (float32, sim(query, positive)),
                        rows (the candidates' rows in documents.parquet, best first) and scores
                        (float32, theirs), exactly as the search returned them
    documents.parquet   the documents that are some pair's candidate: doc_id, group_id, text
    compute.json        what the encoding and the search cost, and for which trial they ran
    manifest.json       the identity (`candidates_identity`) and counts, written last

The version hashes the parent and how it encodes (pair length, pooling, prefixes, the mining
code), the corpus revision, top_k, the pairs table's bytes and the searched pairs' ids; not
the rule, the quota or how many workers searched (the sharded search returns what one process
does, `embedlab.negatives.sharded`). Scores are stored at the search's own precision, so a set
read back selects exactly what the fresh search would have.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.negatives.mining import Candidates

CANDIDATES_DIR = "mining-candidates"  # under the prepared data: <version>/
CANDIDATES_FORMAT = "embedlab-mining-candidates/1"
QUERIES_FILE = "queries.parquet"
DOCUMENTS_FILE = "documents.parquet"
COST_FILE = "compute.json"
MANIFEST_FILE = "manifest.json"
QUERY_SCHEMA = pa.schema([("pair_id", pa.string()), ("positive_score", pa.float32()),
                          ("rows", pa.list_(pa.int32())), ("scores", pa.list_(pa.float32()))])
DOCUMENT_SCHEMA = pa.schema([("doc_id", pa.string()), ("group_id", pa.string()), ("text", pa.string())])


def candidates_identity(*, encoder_id: str, encoding: Mapping[str, Any], corpus_revision: str, top_k: int,
                        pairs_table: str, pair_ids: Iterable[str]) -> dict[str, Any]:
    """Everything that decides a stored set's bytes (module docstring); `pairs_table` is the
    table's sha256, `encoding` how the parent encodes (with the mining code's revision)."""
    return {"format": CANDIDATES_FORMAT, "encoder_id": encoder_id, "encoding": dict(encoding),
            "corpus_revision": corpus_revision, "top_k": top_k, "pairs_table": pairs_table,
            "pair_ids": hashlib.sha256("\n".join(sorted(pair_ids)).encode()).hexdigest()}


def candidates_version(identity: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def save_candidates(directory: Path, candidates: Candidates, identity: Mapping[str, Any],
                    cost: Mapping[str, Any]) -> Path:
    """Write a set into `directory` (a staging directory `build_once` renames into place): its
    queries and candidate documents (only those some pair found), its cost, its manifest last."""
    directory.mkdir(parents=True, exist_ok=True)
    found = np.unique(candidates.rows[candidates.rows >= 0])
    remap = np.full(max(len(candidates.doc_ids), 1), -1, dtype=np.int64)
    remap[found] = np.arange(len(found))
    rows = np.where(candidates.rows >= 0, remap[np.maximum(candidates.rows, 0)], -1)
    queries = pa.table({"pair_id": candidates.pair_ids,
                        "positive_score": pa.array(candidates.positive_scores, pa.float32()),
                        "rows": pa.array(rows.astype(np.int32).tolist(), pa.list_(pa.int32())),
                        "scores": pa.array(candidates.scores.astype(np.float32).tolist(), pa.list_(pa.float32()))},
                       schema=QUERY_SCHEMA)
    documents = pa.table({"doc_id": [candidates.doc_ids[r] for r in found.tolist()],
                          "group_id": [candidates.groups[r] for r in found.tolist()],
                          "text": [candidates.texts[r] for r in found.tolist()]}, schema=DOCUMENT_SCHEMA)
    pq.write_table(queries, directory / QUERIES_FILE)
    pq.write_table(documents, directory / DOCUMENTS_FILE)
    (directory / COST_FILE).write_text(json.dumps(dict(cost), indent=2, sort_keys=True))
    counts = {"queries": len(candidates.pair_ids), "top_k": int(candidates.rows.shape[1]),
              "candidate_documents": len(found), "training_documents_indexed": candidates.indexed,
              "dev_test_documents_left_out": candidates.left_out}
    (directory / MANIFEST_FILE).write_text(json.dumps(
        {**identity, "version": candidates_version(identity), "counts": counts}, indent=2, sort_keys=True))
    return directory


def load_candidates(directory: Path, identity: Mapping[str, Any] | None = None) -> Candidates:
    """A stored set as the `Candidates` `select_negatives` reads; with `identity`, a set whose
    manifest names other inputs is refused (ValueError), never selected from."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if identity is not None:
        differ = sorted(key for key in identity if manifest.get(key) != identity[key])
        if differ:
            raise ValueError(f"{directory}: mining candidates of other inputs ({', '.join(differ)} differ)")
    queries = pq.read_table(directory / QUERIES_FILE)
    documents = pq.read_table(directory / DOCUMENTS_FILE)
    top_k = manifest["counts"]["top_k"]
    return Candidates(
        pair_ids=queries["pair_id"].to_pylist(),
        doc_ids=documents["doc_id"].to_pylist(), groups=documents["group_id"].to_pylist(),
        texts=documents["text"].to_pylist(),
        positive_scores=queries["positive_score"].to_numpy(),
        scores=np.array(queries["scores"].to_pylist(), dtype=np.float32).reshape(-1, top_k),
        rows=np.array(queries["rows"].to_pylist(), dtype=np.int64).reshape(-1, top_k),
        indexed=manifest["counts"]["training_documents_indexed"],
        left_out=manifest["counts"]["dev_test_documents_left_out"],
    )


def read_manifest(directory: Path) -> dict[str, Any]:
    """A stored set's manifest; FileNotFoundError for a directory without one (incomplete or absent)."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no mining candidates in {directory} (no {MANIFEST_FILE})")
    return json.loads(path.read_text())


def read_cost(directory: Path) -> dict[str, Any]:
    """What making a stored set cost (`COST_FILE`): flops, seconds, wall_seconds, workers,
    `built_for` (the config hash of the trial it was made for) and the corpus vectors it used."""
    return json.loads((Path(directory) / COST_FILE).read_text())
