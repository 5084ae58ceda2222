"""Teacher embeddings: a frozen teacher's vectors of unlabelled training-split text, the targets
of embedding distillation (`contrastive.distillation.embedding_mse_weight`).

Embedding distillation needs no pairs: the student learns from documents alone. To ride on
the pair stream's schedule, worker split and budget, each scheduled pair is given one
training-split document of the prepared corpus (`assign_documents`: the documents in an order
drawn from the trial's data seed, dealt to the pair ids in sorted order, so distinct pairs get
distinct documents until the documents run out). A document is read as "title\\ntext" (its
text when untitled, as mining reads it) and cut at a token boundary so that the student's
passage prefix plus the text fits `contrastive.pair_length` with [CLS] and [SEP]
(`embedlab.teacher.student_view.cut_to_tokens`): the teacher encodes exactly the text the
student sees, never a longer one.

The teacher's vectors have the teacher's width (384 for all-MiniLM-L6-v2). A student of
another width regresses onto a fixed linear projection of them, stated here and recorded:

    target = normalise(P t),  P = the first `student` rows (or columns) of an orthonormal
    matrix drawn from a Gaussian seeded with PROJECTION_SEED (`projection_matrix`).

A narrower student gets P with orthonormal rows (a random subspace of the teacher's: cosines
between texts are kept up to a distortion that shrinks with the student's width, the
Johnson-Lindenstrauss property); a wider one P with orthonormal columns (an isometry: every
cosine kept); an equal width the identity. P is not trained: it is part of the target, and
the set records its seed and shape, so the same inputs give the same targets.

Stored under the prepared data, in `teacher-embeddings/<version>/`:

- `embeddings.parquet`: one row per pair: `pair_id`, `doc_id`, the `text` as cut (prefixes
  excluded), and its `target` (student-width float32 list).
- `compute.json`: the teacher's FLOPs (FlopCounterMode), CPU and wall seconds, outside the
  training budget and reported beside it, as teacher labels' are.
- `manifest.json`, written last: the set's identity (teacher, prefix, documents' revision,
  pair ids, the student tokenizer and pair length behind the cut, the projection, this code),
  its counts and the disclosure. A set whose manifest names other inputs is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.artifacts.sync import node_path
from embedlab.teacher import labels as teacher_labels
from embedlab.teacher.labels import TeacherLabelsError

EMBEDDINGS_FILE = "embeddings.parquet"
MANIFEST_FILE = "manifest.json"
COST_FILE = teacher_labels.COST_FILE
# What a set's manifest and a table of its trials disclose: teacher labels' DISCLOSURE, said of
# vectors rather than judgments.
VECTORS_DISCLOSURE = ("teacher embeddings are all-MiniLM-L6-v2's vectors of unlabelled training text, not human "
                      f"judgments; {teacher_labels.TEACHER_TRAINING_DATA}")
EMBEDDINGS_FORMAT = "embedlab-teacher-embeddings/1"
PROJECTION_SEED = 20260
PROJECTION = "normalise(P t): P orthonormal rows (narrower student) or columns (wider), from a seeded Gaussian's QR"
# The code that decides a set beyond its inputs: this module, how the teacher encodes, and how
# the stream reads a pair's document (what the student encodes).
EMBEDDINGS_CODE = (
    "teacher/embeddings.py", "teacher/student_view.py", "tasks/baselines.py", "streams/pair_stream.py",
)


def projection_matrix(teacher_width: int, student_width: int, seed: int = PROJECTION_SEED) -> np.ndarray:
    """(student_width, teacher_width) float64: the fixed projection (module docstring); the
    identity when the widths are equal."""
    if teacher_width < 1 or student_width < 1:
        raise ValueError(f"widths must be positive, got teacher {teacher_width} and student {student_width}")
    if teacher_width == student_width:
        return np.eye(student_width)
    wide, narrow = max(teacher_width, student_width), min(teacher_width, student_width)
    gaussian = np.random.default_rng(seed).standard_normal((wide, narrow))
    q, r = np.linalg.qr(gaussian)  # (wide, narrow), orthonormal columns
    q = q * np.sign(np.diag(r))[None, :]  # the unique QR with a positive diagonal: independent of LAPACK's signs
    return q.T if student_width < teacher_width else q


def project(vectors: np.ndarray, student_width: int, seed: int = PROJECTION_SEED) -> np.ndarray:
    """(N, teacher width) unit rows -> (N, student_width) float32 unit rows: normalise(P t)."""
    projected = vectors.astype(np.float64) @ projection_matrix(vectors.shape[1], student_width, seed).T
    norms = np.linalg.norm(projected, axis=1, keepdims=True)
    return (projected / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def document_text(title: str | None, text: str) -> str:
    """A document as mining and the teacher read it: "title\\ntext", or its text when untitled."""
    return f"{title}\n{text}" if title else text


def assign_documents(pair_ids: Sequence[str], doc_ids: Sequence[str], seed: int) -> dict[str, str]:
    """pair_id -> the doc_id of its training-split document (module docstring): the documents
    in a seeded random order, dealt to the distinct pair ids in sorted order, cycling when
    there are more pairs than documents."""
    if not doc_ids:
        raise TeacherLabelsError("embedding distillation needs training-split documents; the corpus has none")
    order = np.random.default_rng(seed).permutation(len(doc_ids))
    return {pair_id: doc_ids[order[i % len(order)]] for i, pair_id in enumerate(sorted(set(pair_ids)))}


def embeddings_identity(*, teacher: dict[str, Any], passage_prefix: str, student_prefix: str, corpus_revision: str,
                        tokenizer_hash: str, pair_length: int, student_width: int, seed: int,
                        pair_ids: Sequence[str], code: str) -> dict[str, Any]:
    """Everything that decides a set's bytes (module docstring)."""
    return {"format": EMBEDDINGS_FORMAT, "teacher": teacher, "passage_prefix": passage_prefix,
            "student_prefix": student_prefix, "corpus_revision": corpus_revision, "tokenizer_hash": tokenizer_hash,
            "pair_length": pair_length, "documents_seed": seed,
            "projection": {"seed": PROJECTION_SEED, "student_width": student_width, "method": PROJECTION},
            "pair_ids": hashlib.sha256("\n".join(sorted(set(pair_ids))).encode()).hexdigest(), "code": code}


embeddings_version = teacher_labels.labels_version  # the sha256 of the identity's JSON, as for labels


def encode_texts(encode: Callable[[list[str]], np.ndarray], texts: Sequence[str], *, prefix: str = "",
                 progress: Callable[[str], None] | None = None) -> np.ndarray:
    """(N, teacher width) unit rows of `prefix + text` under `encode`, in chunks with progress
    (`teacher_labels.encode_in_chunks`)."""
    return teacher_labels.encode_in_chunks(encode, [prefix + t for t in texts], "teacher embeddings", progress)


def embeddings_table(pair_ids: Sequence[str], doc_ids: Sequence[str], texts: Sequence[str],
                     targets: np.ndarray) -> pa.Table:
    """The set's table: one row per pair, its target a fixed-size float32 list."""
    flat = pa.array(np.ascontiguousarray(targets, dtype=np.float32).reshape(-1))
    return pa.table({"pair_id": pa.array(list(pair_ids), pa.string()), "doc_id": pa.array(list(doc_ids), pa.string()),
                     "text": pa.array(list(texts), pa.string()),
                     "target": pa.FixedSizeListArray.from_arrays(flat, targets.shape[1])})


def write_embeddings(directory: Path, table: pa.Table, identity: dict[str, Any], cost: dict[str, Any]) -> Path:
    """Save a set: the table, its cost and its manifest (`teacher.labels.write_table_and_cost`)."""
    teacher_labels.write_table_and_cost(directory, EMBEDDINGS_FILE, table, cost)
    counts = {"pairs": table.num_rows, "documents": len(set(table["doc_id"].to_pylist())),
              "empty_texts": sum(1 for t in table["text"].to_pylist() if not t)}
    (directory / MANIFEST_FILE).write_text(json.dumps(
        {**identity, "version": embeddings_version(identity), "counts": counts,
         "labels": "teacher embeddings (a model's vectors of unlabelled text)", "disclosure": VECTORS_DISCLOSURE},
        indent=2, sort_keys=True))
    return directory


def load_manifest(directory: Path, expected: dict[str, Any]) -> dict[str, Any]:
    """A set's manifest, refused (TeacherLabelsError) unless it records exactly `expected`'s identity."""
    return teacher_labels.load_manifest(directory, expected, "teacher embeddings")


_rows: dict[str, tuple[dict[str, int], list[str], np.ndarray]] = {}


def _set_rows(path: str) -> tuple[dict[str, int], list[str], np.ndarray]:
    if path not in _rows:
        table = pq.read_table(node_path(path), columns=["pair_id", "text", "target"])
        column = table["target"].combine_chunks()
        width = column.type.list_size
        targets = column.flatten().to_numpy(zero_copy_only=False).reshape(-1, width).astype(np.float32)
        _rows[path] = ({p: i for i, p in enumerate(table["pair_id"].to_pylist())}, table["text"].to_pylist(), targets)
    return _rows[path]


def embedding_rows(path: str, pair_ids: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """Each pair's document text ('' where the set has none) and its (B, d) float32 target (nan
    rows where it has none: masked in training, never filled)."""
    index, texts, targets = _set_rows(path)
    out = np.full((len(pair_ids), targets.shape[1]), np.nan, dtype=np.float32)
    picked = []
    for row, pair_id in enumerate(pair_ids):
        at = index.get(pair_id)
        picked.append("" if at is None else texts[at])
        if at is not None:
            out[row] = targets[at]
    return picked, out


def teacher_embedding_items(directory: Path) -> Iterator[tuple[str, str]]:
    """Every text a set's teacher encoded, as "<set>:<pair id>:<doc id>": the audit's
    teacher-labels stage reads these beside the scored texts."""
    directory = Path(directory)
    table = pq.read_table(directory / EMBEDDINGS_FILE, columns=["pair_id", "doc_id", "text"])
    for pair_id, doc_id, text in zip(*(table[c].to_pylist() for c in ("pair_id", "doc_id", "text"))):
        yield f"{directory.name}:{pair_id}:{doc_id}", text

