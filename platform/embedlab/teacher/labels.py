"""Teacher labels: a frozen teacher's scores of the (query, candidate) rows phase 3 trains on.

For a phase-3 trial with a `contrastive.distillation.teacher`, every scheduled pair's query is scored by
the teacher against its positive and against each of its negatives, exactly as the stream
gives them to training (`embedlab.negatives.reading.pair_negatives`). The scores are computed
once and stored under the prepared data, in `teacher-labels/<version>/`:

- `labels.parquet`: one row per (pair, candidate): `pair_id`, `doc_id` (`POSITIVE` for the
  positive, else the negative's id), the `query` and candidate `text` as the teacher saw them
  (prefixes excluded; cut to the student's view, below), its cosine `score`, and the pair's
  `confidence` (the teacher's positive score minus its best negative score; nan without a
  negative) and `agrees` (whether the teacher ranks the positive above every negative, the
  label's claim; null without a negative, where there is nothing to rank).
- `manifest.json`, written last (it marks the set complete): the set's identity and counts
  (pairs, scores, and the pairs the teacher agrees with, disagrees with, and has no negative
  to judge).
- `compute.json`: what the teacher's encoding cost (FLOPs measured by FlopCounterMode, CPU
  and wall seconds), outside the training budget and reported beside it as mining is.

The teacher scores each text as the student sees it: cut at a token boundary of the student's
tokenizer so that the student's prefix plus the text fits `contrastive.pair_length` with [CLS]
and [SEP] (`embedlab.teacher.student_view.cut_to_tokens`). A label then judges the text the
student is trained to rank, not a longer one the student never reads, and the teacher's cost
follows the student's length rather than its own maximum (256 tokens for all-MiniLM-L6-v2).

The version hashes the teacher's identity (its package and version, the sha256 of its weights,
pooling, maximum length), the teacher's prefixes, the pairs table's bytes, the negative sets'
versions, the slots per pair, the pair ids, the student's view (its tokenizer, prefixes and
pair length) and this code: a changed input is a new set, and a set whose manifest names other
inputs is refused (`load_manifest`). Labels are a model's judgments, not human ones: every
record calls them teacher labels, with the teacher named. A candidate the teacher has no score
for is absent from the table and masked in training, never filled.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.artifacts.sync import node_path
from embedlab.core.errors import UserError

LABELS_FILE = "labels.parquet"
MANIFEST_FILE = "manifest.json"
COST_FILE = "compute.json"
POSITIVE = ""  # the doc_id of a pair's positive in the labels table
LABELS_FORMAT = "embedlab-teacher-labels/3"
# The code that decides a set beyond its inputs: this module, the cut to the student's view, how
# the teacher encodes, and how the stream composes a pair's negatives (what is scored).
TEACHER_CODE = (
    "teacher/labels.py", "teacher/student_view.py", "tasks/baselines.py", "streams/pair_stream.py",
)
LABELS_SCHEMA = pa.schema([
    ("pair_id", pa.string()), ("doc_id", pa.string()), ("query", pa.string()), ("text", pa.string()),
    ("score", pa.float32()), ("confidence", pa.float32()), ("agrees", pa.bool_()),
])
# What the audit cannot reach, said by every teacher set's disclosure (labels here, vectors in
# `embedlab.teacher.embeddings`).
TEACHER_TRAINING_DATA = ("its training data (over a billion pairs, code search among them, per its model card) "
                         "cannot be audited here")
DISCLOSURE = f"teacher labels are all-MiniLM-L6-v2's judgments, not human ones; {TEACHER_TRAINING_DATA}"


class TeacherLabelsError(UserError, ValueError):
    """A teacher-labels set does not match what a trial trains on."""


@dataclass(frozen=True)
class ScoredPair:
    """One scheduled pair as the teacher scores it: its query, positive and (doc id, text) negatives."""

    pair_id: str
    query: str
    positive: str
    negatives: tuple[tuple[str, str], ...]


def load_teacher(name: str):
    """The named teacher (`embedlab.core.config.TEACHERS`), loaded once per process."""
    # here: torch and transformers (the teacher's model), which reading a labels set does not need
    from embedlab.tasks.baselines import MINILM, load_minilm

    if name != MINILM:
        raise TeacherLabelsError(f"unknown teacher {name!r}; valid: [{MINILM!r}]")
    return load_minilm()


def labels_identity(*, teacher: dict[str, Any], query_prefix: str, passage_prefix: str, pairs_table: str,
                    negative_sets: dict[str, str | None], negatives_per_pair: int, pair_ids: Iterable[str],
                    student_view: dict[str, Any], code: str) -> dict[str, Any]:
    """Everything that decides a set's bytes (module docstring); `pairs_table` the table's
    sha256, `negative_sets` each negative set's version (None: not used), `student_view` what
    decides the cut (the student's tokenizer hash, prefixes and pair length)."""
    return {"format": LABELS_FORMAT, "teacher": teacher, "query_prefix": query_prefix,
            "passage_prefix": passage_prefix, "pairs_table": pairs_table, "negative_sets": negative_sets,
            "negatives_per_pair": negatives_per_pair, "student_view": student_view,
            "pair_ids": hashlib.sha256("\n".join(sorted(pair_ids)).encode()).hexdigest(), "code": code}


def labels_version(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


ENCODE_CHUNK = 4096  # texts a teacher encodes between progress lines


def encode_in_chunks(encode: Callable[[list[str]], np.ndarray], texts: Sequence[str], what: str,
                     progress: Callable[[str], None] | None = None) -> np.ndarray:
    """(N, d) rows of `texts` under `encode`, `ENCODE_CHUNK` texts a call, a line to `progress`
    after each (`what` names the set); refused when the teacher returns another row count."""
    parts, started = [], time.perf_counter()
    for start in range(0, len(texts), ENCODE_CHUNK):
        parts.append(encode(list(texts[start:start + ENCODE_CHUNK])))
        if progress is not None:
            done = min(start + ENCODE_CHUNK, len(texts))
            progress(f"{what}: {done:,}/{len(texts):,} texts encoded ({time.perf_counter() - started:.0f} s)")
    vectors = np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)
    if len(vectors) != len(texts):
        raise TeacherLabelsError(f"the teacher returned {len(vectors)} rows for {len(texts)} texts")
    return vectors


def score_pairs(encode: Callable[[list[str]], np.ndarray], pairs: Sequence[ScoredPair], *,
                query_prefix: str = "", passage_prefix: str = "",
                progress: Callable[[str], None] | None = None) -> pa.Table:
    """The labels table (`LABELS_SCHEMA`) of `pairs` under `encode` (unit rows): each distinct
    prefixed text encoded once, `ENCODE_CHUNK` texts a call (a line to `progress` after each);
    a score is the cosine of the query's and the candidate's rows."""
    queries = sorted({p.query for p in pairs})
    passages = sorted({text for p in pairs for text in (p.positive, *(t for _, t in p.negatives))})
    texts = [query_prefix + q for q in queries] + [passage_prefix + t for t in passages]
    vectors = encode_in_chunks(encode, texts, "teacher labels", progress)
    query_row = {q: vectors[i] for i, q in enumerate(queries)}
    passage_row = {t: vectors[len(queries) + i] for i, t in enumerate(passages)}
    columns: dict[str, list] = {name: [] for name in LABELS_SCHEMA.names}
    for pair in pairs:
        q = query_row[pair.query]
        candidates = [(POSITIVE, pair.positive), *pair.negatives]
        scores = [float(np.dot(q, passage_row[text])) for _, text in candidates]
        confidence = scores[0] - max(scores[1:]) if len(scores) > 1 else math.nan
        for (doc_id, text), score in zip(candidates, scores):
            for name, value in (("pair_id", pair.pair_id), ("doc_id", doc_id), ("query", pair.query),
                                ("text", text), ("score", score), ("confidence", confidence),
                                ("agrees", None if math.isnan(confidence) else bool(confidence > 0))):
                columns[name].append(value)
    return pa.table(columns, schema=LABELS_SCHEMA)


def measured_encode(teacher) -> tuple[Callable[[list[str]], np.ndarray], Callable[[], dict[str, Any]]]:
    """`teacher.encode` under torch's FlopCounterMode, and a function returning what it has cost:
    measured FLOPs, this thread's CPU seconds and wall seconds."""
    from torch.utils.flop_counter import FlopCounterMode

    spent = {"flops": 0.0}
    cpu, wall = time.thread_time(), time.perf_counter()

    def encode(texts: list[str]) -> np.ndarray:
        with FlopCounterMode(display=False) as counter:
            vectors = teacher.encode(texts)
        spent["flops"] += float(counter.get_total_flops())
        return vectors

    def cost() -> dict[str, Any]:
        return {"flops": spent["flops"], "seconds": time.thread_time() - cpu,
                "wall_seconds": time.perf_counter() - wall,
                "clock": "thread-cpu of the trial driver (the teacher's encoding)",
                "counter": "torch.utils.flop_counter.FlopCounterMode"}

    return encode, cost


def write_table_and_cost(directory: Path, name: str, table: pa.Table, cost: dict[str, Any]) -> None:
    """A set's table and its `COST_FILE` (teacher embeddings share it). A set is written into
    a staging directory that `embedlab.artifacts.build.build_once` renames into place whole."""
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, directory / name)
    (directory / COST_FILE).write_text(json.dumps(cost, indent=2, sort_keys=True))


def write_labels(directory: Path, table: pa.Table, identity: dict[str, Any], cost: dict[str, Any]) -> Path:
    """Save a set: the table, its cost and its manifest (`write_table_and_cost`)."""
    write_table_and_cost(directory, LABELS_FILE, table, cost)
    # One value per pair (each of its rows repeats it): True, False, or None without a negative.
    agrees = dict(zip(table["pair_id"].to_pylist(), table["agrees"].to_pylist()))
    counts = {"pairs": len(agrees), "scores": table.num_rows,
              "teacher_agrees": sum(value is True for value in agrees.values()),
              "teacher_disagrees": sum(value is False for value in agrees.values()),
              "pairs_without_negatives": sum(value is None for value in agrees.values())}
    (directory / MANIFEST_FILE).write_text(json.dumps(
        {**identity, "version": labels_version(identity), "counts": counts, "labels": "teacher",
         "disclosure": DISCLOSURE}, indent=2, sort_keys=True))
    return directory


def load_manifest(directory: Path, expected: dict[str, Any], what: str = "teacher labels") -> dict[str, Any]:
    """A set's manifest, refused (TeacherLabelsError) unless it records exactly `expected`'s
    identity: labels computed for another teacher, table, negatives or code are never used.
    `what` names the kind of set in the message (teacher embeddings share the rule)."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise TeacherLabelsError(f"no {what} set at {directory} (no {MANIFEST_FILE}: incomplete or absent)")
    manifest = json.loads(path.read_text())
    differ = sorted(key for key in expected if manifest.get(key) != expected[key])
    if differ:
        raise TeacherLabelsError(f"{what} at {directory} were computed for other inputs ({', '.join(differ)} "
                                 "differ from this trial's): recompute them by removing the directory")
    return manifest


_score_maps: dict[str, tuple[dict[tuple[str, str], float], dict[str, float]]] = {}


def _score_map(path: str) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
    if path not in _score_maps:
        table = pq.read_table(node_path(path), columns=["pair_id", "doc_id", "score", "confidence"])
        ids, docs = table["pair_id"].to_pylist(), table["doc_id"].to_pylist()
        scores, confidence = table["score"].to_pylist(), table["confidence"].to_pylist()
        _score_maps[path] = ({(p, d): s for p, d, s in zip(ids, docs, scores)},
                             {p: c for p, c in zip(ids, confidence)})
    return _score_maps[path]


def below_confidence(confidence: float, minimum: float | None) -> bool:
    """Whether a pair's teacher margin keeps it from distillation: below `minimum`, or nan (no
    negative to compare with) when a minimum is set."""
    return minimum is not None and not confidence >= minimum


def teacher_score_rows(path: str, pair_ids: Sequence[str], slot_ids: Sequence[Sequence[str | None]], *,
                       min_confidence: float | None = None) -> np.ndarray:
    """(B, 1 + K) float32: each row's teacher score of its positive, then of each negative slot
    (`slot_ids[b][k]`, None for an empty slot); nan where the set has no score, for an empty
    slot, and for the whole row of a pair below `min_confidence` (`below_confidence`)."""
    scores, confidence = _score_map(path)
    width = 1 + max((len(s) for s in slot_ids), default=0)
    out = np.full((len(pair_ids), width), np.nan, dtype=np.float32)
    for row, (pair_id, slots) in enumerate(zip(pair_ids, slot_ids)):
        if below_confidence(confidence.get(pair_id, math.nan), min_confidence):
            continue
        for column, doc_id in enumerate((POSITIVE, *slots)):
            if doc_id is not None:
                out[row, column] = scores.get((pair_id, doc_id), math.nan)
    return out


def pairs_below_confidence(directory: Path, minimum: float | None) -> int:
    """How many of the set's pairs lose their teacher labels to `minimum` (`below_confidence`)."""
    if minimum is None:
        return 0
    _, confidence = _score_map(str(Path(directory) / LABELS_FILE))
    return sum(below_confidence(value, minimum) for value in confidence.values())


def set_cost(directory: Path | None) -> dict[str, float]:
    """What computing a teacher set (labels or embeddings) cost, from its `COST_FILE`: FLOPs,
    CPU and wall seconds (nan where the file lacks one; empty without a set)."""
    if directory is None:
        return {}
    path = Path(directory) / COST_FILE
    cost = json.loads(path.read_text()) if path.is_file() else {}
    return {key: float(cost.get(key, math.nan)) for key in ("flops", "seconds", "wall_seconds")}


def teacher_compute(directory: Path | None) -> dict[str, float]:
    """`compute/teacher_*` of a trial: what scoring its set cost (`set_cost`). A set is scored
    once and shared by every trial that needs it, so a sum over trials counts it again."""
    return {f"compute/teacher_{key}": value for key, value in set_cost(directory).items()}


def teacher_label_items(directory: Path) -> Iterator[tuple[str, str]]:
    """Every text a set's teacher scored, once each, as "<set>:<pair id>:query" and
    "<set>:<pair id>:<doc id or positive>": the teacher-labels stage of the audit."""
    directory = Path(directory)
    table = pq.read_table(directory / LABELS_FILE, columns=["pair_id", "doc_id", "query", "text"])
    seen: set[str] = set()
    for pair_id, doc_id, query, text in zip(*(table[c].to_pylist() for c in ("pair_id", "doc_id", "query", "text"))):
        if pair_id not in seen:
            seen.add(pair_id)
            yield f"{directory.name}:{pair_id}:query", query
        yield f"{directory.name}:{pair_id}:{doc_id or 'positive'}", text
