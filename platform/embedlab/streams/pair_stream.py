"""The phase 2-3 data stream on Ray Data: pairs -> sample by pair share -> tokenize -> assign.

Pairs are built once per prepared data directory and builder set from the training split
only (`embedlab.pairs.table`). The mixture is over pair builders with shares of consumed
*positive pairs*, drawn by the same `deficit/1` schedule and repetition cap as phase-1
tokens: each row, one (query, positive), is one unit, so a user pair with three positives
(three rows sharing its positive group, `pair_sources.user_pair_rows`) counts as three in
shares and budgets. Each stream row is one pair: `[CLS] prefix + query [SEP]`
and `[CLS] prefix + positive [SEP]`, truncated and padded to `pair_length`, its positive
group as an int64 hash, its builder index and its non-padding token counts; phase 3 adds
`hard_negatives` mined negatives per pair; with embedding distillation each row also carries
its pair's training-split document and the teacher's target for it
(`embedlab.teacher.embeddings`). Workers train on their rows of each global batch
as in phase 1 (`embedlab.streams.packed.worker_rows`); a row is a draw of the schedule, so worker
r's Dataset holds the draws at positions r, r + W, ... of the whole global batches
(`embedlab.streams.packed.WorkerSplit`) and tokenises only those (`pair_dataset`'s `split`).

`contrastive.batch_composition` decides how builders meet in a batch. "mixed" draws pair by
pair, so every batch mixes the builders by share. "one-source" (as Contrastors and
FlagEmbedding do: in-batch negatives from one builder are harder) draws whole optimizer
steps (`embedlab.train.budget.step_units` consecutive rows) from one builder each: the same
`deficit/1` rule over whole steps picks the builder lagging its share of pairs the most, so
the shares hold to within one step over the run. Either way a builder's pairs come in the
same shuffled order. The stream is one list of rows in both: the step blocks are what keep
every worker and microbatch of a step (and a step the budget cuts short) on one builder.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.artifacts.sync import node_path
from embedlab.core.config import BATCH_COMPOSITIONS
from embedlab.negatives.reading import pair_negatives
from embedlab.sources.mixture import MixtureError, Schedule, sample_schedule
from embedlab.streams.packed import WorkerSplit, schedule_windows
from embedlab.prepared.pieces import cached_tokenizer
from embedlab.teacher.embeddings import embedding_rows
from embedlab.teacher.labels import teacher_score_rows


ONE_SOURCE_SCHEDULE = "one-source-deficit/1"  # `Schedule.version` of a one-source schedule


def group_hash(group: str) -> int:
    """A positive group id as a signed 64-bit integer (equal strings, equal numbers)."""
    return int.from_bytes(hashlib.sha256(group.encode()).digest()[:8], "big", signed=True)


def pair_schedule(
    pairs_path: Path, shares: dict[str, float], *, target_pairs: int, max_epochs: float, seed: int,
    composition: str = "mixed", step_pairs: int = 1,
) -> tuple[Schedule, dict[str, int]]:
    """Schedule of pair rows by builder share; returns it and each builder's first row.

    `composition` "mixed" draws pair by pair; "one-source" draws blocks of `step_pairs` rows
    (one optimizer step, all workers and microbatches) from one builder each.
    """
    builders = pq.read_table(pairs_path, columns=["builder"])["builder"].to_numpy(zero_copy_only=False)
    units: dict[str, np.ndarray] = {}
    offsets: dict[str, int] = {}
    for name in shares:
        rows = np.flatnonzero(builders == name)
        if len(rows):
            units[name] = np.ones(len(rows), dtype=np.int64)
            offsets[name] = int(rows[0])
    if composition == "one-source":
        schedule = one_source_schedule(units, shares, step_pairs=step_pairs, target_pairs=target_pairs,
                                       max_epochs=max_epochs, seed=seed)
    elif composition == "mixed":
        schedule = sample_schedule(units, shares, target_units=target_pairs, max_epochs=max_epochs, seed=seed)
    else:
        raise ValueError(f"batch composition {composition!r}; valid: {list(BATCH_COMPOSITIONS)}")
    return schedule, offsets


def step_sources(shares: dict[str, float], *, step_pairs: int, target_pairs: int) -> np.ndarray:
    """The builder index (into `shares`) of each one-source step: `deficit/1` over whole steps,

        next builder = argmax_b ( share_b * pairs_total - pairs_b )   (ties: listed order)

    until `target_pairs` pairs are scheduled."""
    if step_pairs < 1:
        raise ValueError(f"step_pairs must be >= 1, got {step_pairs}")
    share = np.array([shares[name] for name in shares])
    consumed = np.zeros(len(share))
    picked: list[int] = []
    total = 0
    while total < target_pairs:
        builder = int(np.argmax(share * total - consumed))
        consumed[builder] += step_pairs
        total += step_pairs
        picked.append(builder)
    return np.asarray(picked, dtype=np.int16)


def one_source_schedule(
    units_by_source: dict[str, np.ndarray], shares: dict[str, float], *, step_pairs: int, target_pairs: int,
    max_epochs: float, seed: int,
) -> Schedule:
    """A schedule whose every block of `step_pairs` rows comes from one builder (`step_sources`).

    Within a builder, pairs are read in `sample_schedule`'s per-epoch shuffled order, the
    order the mixed schedule reads them in; the repetition cap is checked per builder before
    anything is drawn."""
    names = list(shares)
    steps = step_sources(shares, step_pairs=step_pairs, target_pairs=target_pairs)
    source = np.repeat(steps, step_pairs)
    item = np.zeros(len(source), dtype=np.int64)
    for index, name in enumerate(names):
        if name not in units_by_source or len(units_by_source[name]) == 0:
            raise MixtureError(f"mixture source {name!r} has no training items")
        needed = int((source == index).sum())
        cap = int(np.floor(max_epochs * len(units_by_source[name])))
        if needed > cap:
            raise MixtureError(
                f"source {name!r} holds {len(units_by_source[name]):,} pairs; one-source steps of "
                f"{step_pairs:,} pairs give it {needed:,}, more than {max_epochs:g} epochs (the repetition "
                "cap) allow; lower the budget or its share, or raise max_epochs"
            )
        if needed:
            # A builder's rows fill its steps in stream order, in the order it alone would be read.
            alone = sample_schedule({name: units_by_source[name]}, {name: 1.0}, target_units=needed,
                                    max_epochs=max_epochs, seed=seed)
            item[source == index] = alone.item
    return Schedule(sources=tuple(names), source=source, item=item, units=np.ones(len(source), dtype=np.int64),
                    version=ONE_SOURCE_SCHEDULE, seed=seed)


def _encode(tokenizer, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.full((len(texts), length), tokenizer.pad_id, dtype=np.int32)
    lengths = np.zeros(len(texts), dtype=np.int32)
    for row, tokens in enumerate(tokenizer.encode_batch(texts)):
        sequence = [tokenizer.cls_id, *tokens[: length - 2], tokenizer.sep_id]
        ids[row, : len(sequence)] = sequence
        lengths[row] = len(sequence)
    return ids, lengths


def tokenize_pair_window(
    batch: dict[str, np.ndarray],
    *,
    pairs_path: str,
    tokenizer_path: str,
    length: int,
    query_prefix: str,
    passage_prefix: str,
    negatives_path: str | None,
    negatives_per_pair: int,
    given_negatives_path: str | None = None,
    teacher_labels_path: str | None = None,
    teacher_min_confidence: float | None = None,
    teacher_embeddings_path: str | None = None,
) -> dict[str, np.ndarray]:
    """Ray Data UDF: a window of scheduled pair rows -> tokenised training rows.

    A pair's negatives are its given ones (`given_negatives_path`, a user source's own, screened),
    then its mined ones (`negatives_path`) whose text is no given one's, the first
    `negatives_per_pair` of them. With `teacher_labels_path` each row also carries
    `teacher_scores` (1 + negatives_per_pair,): the teacher's score of its positive and of each
    negative slot, nan where there is none (`embedlab.teacher.labels.teacher_score_rows`).
    With `teacher_embeddings_path` each row carries `distill_ids` (length,): its pair's document,
    `[CLS] passage_prefix + text [SEP]`, and `teacher_embedding` (d,): the teacher's projected
    vector of that text, nan where the set has none
    (`embedlab.teacher.embeddings.embedding_rows`)."""
    table = _pair_rows(pairs_path)
    tokenizer = cached_tokenizer(tokenizer_path)
    rows = np.concatenate([np.asarray(r, dtype=np.int64) for r in batch["rows"]])
    builder = np.concatenate([np.asarray(b, dtype=np.int32) for b in batch["source_index"]])
    picked = table.take(pa.array(rows))
    pair_ids = picked["pair_id"].to_pylist()
    query_ids, query_len = _encode(tokenizer, [query_prefix + q for q in picked["query"].to_pylist()], length)
    positive_ids, positive_len = _encode(
        tokenizer, [passage_prefix + p for p in picked["positive"].to_pylist()], length
    )
    out = {
        "query_ids": query_ids,
        "positive_ids": positive_ids,
        "group": np.array([group_hash(g) for g in picked["positive_group"].to_pylist()], dtype=np.int64),
        "builder_index": builder,
        "tokens": query_len + positive_len,
    }
    if negatives_path is not None or given_negatives_path is not None:
        composed = pair_negatives(pair_ids, negatives_path=negatives_path, given_negatives_path=given_negatives_path,
                                  negatives_per_pair=negatives_per_pair)
        texts, groups, slot_ids = [], [], []
        for pair_id in pair_ids:
            mined = composed[pair_id]
            slot_ids.append([doc_id for doc_id, _ in mined] + [None] * (negatives_per_pair - len(mined)))
            # A pair with fewer mined negatives than slots fills the rest with empty rows,
            # which the loss masks out as ineligible by their empty length: a repeated
            # negative would count twice in the denominator.
            for k in range(negatives_per_pair):
                if k < len(mined):
                    doc_id, text = mined[k]
                    texts.append(passage_prefix + text)
                    groups.append(group_hash(doc_id))
                else:
                    texts.append("")
                    groups.append(0)
        negative_ids, negative_len = _encode(tokenizer, texts, length)
        empty = np.array([t == "" for t in texts])
        negative_len[empty] = 0
        out["negative_ids"] = negative_ids.reshape(len(rows), negatives_per_pair, length)
        out["negative_len"] = negative_len.reshape(len(rows), negatives_per_pair)
        out["negative_group"] = np.array(groups, dtype=np.int64).reshape(len(rows), negatives_per_pair)
        out["tokens"] = out["tokens"] + out["negative_len"].sum(axis=1).astype(np.int32)
        if teacher_labels_path is not None:
            out["teacher_scores"] = teacher_score_rows(teacher_labels_path, pair_ids, slot_ids,
                                                       min_confidence=teacher_min_confidence)
    if teacher_embeddings_path is not None:
        texts, targets = embedding_rows(teacher_embeddings_path, pair_ids)
        out["distill_ids"], distill_len = _encode(tokenizer, [passage_prefix + t for t in texts], length)
        out["teacher_embedding"] = targets
        out["tokens"] = out["tokens"] + distill_len
    return out


_pair_tables: dict[str, pa.Table] = {}


def _pair_rows(path: str) -> pa.Table:
    if path not in _pair_tables:
        _pair_tables[path] = pq.read_table(node_path(path), columns=["pair_id", "query", "positive", "positive_group"])
    return _pair_tables[path]


def pair_windows(schedule: Schedule, offsets: dict[str, int],
                 split: WorkerSplit | None = None) -> list[dict[str, np.ndarray]]:
    """The windows `tokenize_pair_window` reads: every draw of the schedule, or `split`'s
    (stream row i is draw i, one pair a row)."""
    draws = len(schedule.item)
    return schedule_windows(schedule, offsets, None if split is None else split.keep(0, draws, draws))


def pair_dataset(
    pairs_path: Path,
    schedule: Schedule,
    offsets: dict[str, int],
    *,
    tokenizer_path: Path,
    length: int,
    query_prefix: str,
    passage_prefix: str,
    negatives_path: Path | None = None,
    negatives_per_pair: int = 0,
    given_negatives_path: Path | None = None,
    teacher_labels_path: Path | None = None,
    teacher_min_confidence: float | None = None,
    teacher_embeddings_path: Path | None = None,
    split: WorkerSplit | None = None,
):
    """The Ray Dataset of tokenised pairs for one trial, in schedule order: the whole stream,
    or with `split` one worker's rows of it. Every pair is tokenised on its own, so a row is
    the same whichever window holds it."""
    import ray.data

    return ray.data.from_items(pair_windows(schedule, offsets, split)).map_batches(
        tokenize_pair_window,
        fn_kwargs={
            "pairs_path": str(pairs_path),
            "tokenizer_path": str(tokenizer_path),
            "length": length,
            "query_prefix": query_prefix,
            "passage_prefix": passage_prefix,
            "negatives_path": None if negatives_path is None else str(negatives_path),
            "negatives_per_pair": negatives_per_pair,
            "given_negatives_path": None if given_negatives_path is None else str(given_negatives_path),
            "teacher_labels_path": None if teacher_labels_path is None else str(teacher_labels_path),
            "teacher_min_confidence": teacher_min_confidence,
            "teacher_embeddings_path": None if teacher_embeddings_path is None else str(teacher_embeddings_path),
        },
        batch_size=1,
        batch_format="numpy",
        num_cpus=0.25,
    )


