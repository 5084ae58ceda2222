"""What each training stage reads, as (item id, text) streams for the contamination audit.

    pretraining        training-split documents of the mixture's sources (phase 1)
    tokenizer-sample   the documents the tokenizer was trained on
    contrastive-pairs  query and positive texts of the phase 2-3 pairs built from the training split
                       by every built-in builder, and, given the data config, the train split of its
                       user pair sources (`data.user_pairs`): every row's query and positive (a row per
                       positive) and given negatives, the texts the sweep's pre-flight audits
    mined-negatives    hard negatives of every mined set saved with the data (`mined/*/`)
    teacher-labels     every query and candidate a teacher scored, of every teacher-labels set
                       saved with the data (`teacher-labels/*/`, `embedlab.data.teacher_labels`),
                       and every document a teacher encoded for embedding distillation
                       (`teacher-embeddings/*/`, `embedlab.data.teacher_embeddings`)

`pair_table_items` and `mined_set_items` read one frozen pairs table or one mined set: what
a given trial trains on, for the gate before it trains (`embedlab.data.contamination`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from embedlab.data.document import document_text
from embedlab.data.mining import NEGATIVES_FILE
from embedlab.data.pairs import PAIR_BUILDERS, build_pairs
from embedlab.data.prepared import PreparedData
from embedlab.data.teacher_embeddings import EMBEDDINGS_FILE, teacher_embedding_items
from embedlab.data.teacher_labels import LABELS_FILE, teacher_label_items

PAIRS_STAGE = "contrastive-pairs"
MINED_STAGE = "mined-negatives"
TEACHER_STAGE = "teacher-labels"
PHASE1_STAGES = ("pretraining", "tokenizer-sample")
ALL_STAGES = (*PHASE1_STAGES, PAIRS_STAGE, MINED_STAGE, TEACHER_STAGE)


def _documents(prepared: PreparedData, doc_ids: set[str] | None) -> Iterator[tuple[str, str]]:
    sources = list(prepared.record["mixture"]["shares"])
    table = prepared.corpus.read(split="train", sources=sources).select(["doc_id", "title", "text"])
    if doc_ids is not None:
        table = table.filter(pc.is_in(table["doc_id"], value_set=pc.cast(list(doc_ids), "string")))
    for doc_id, title, text in zip(*(table[c].to_pylist() for c in ("doc_id", "title", "text"))):
        yield doc_id, document_text(title, text)


def _pair_texts(pairs: Iterable[tuple[str, str, str]]) -> Iterator[tuple[str, str]]:
    for pair_id, query, positive in pairs:
        yield f"{pair_id}:query", query
        yield f"{pair_id}:positive", positive


def _pairs(prepared: PreparedData, user_pairs: Callable[[], Iterator[tuple[str, str]]] | None
           ) -> Iterator[tuple[str, str]]:
    table = prepared.corpus.read(split="train")
    pairs = build_pairs(table, list(PAIR_BUILDERS), split="train", seed=0, max_pairs_per_builder=None)
    yield from _pair_texts((pair.pair_id, pair.query, pair.positive) for pair in pairs)
    if user_pairs is not None:
        yield from user_pairs()


def pair_table_items(path: Path) -> Iterator[tuple[str, str]]:
    """The texts of one frozen pairs table (`pairs_table.pair_table_path`): "<row id>:query" and
    "<row id>:positive" (a user pair has a row per positive, `pair_sources.row_ids`), then a user
    pair's given negatives ("<row id>:negative:<i>"), when the table has that column."""
    names = pq.read_schema(path).names
    yield from table_items(pq.read_table(path, columns=["pair_id", "query", "positive",
                                                         *(["negatives"] if "negatives" in names else [])]))


def table_items(table: pa.Table) -> Iterator[tuple[str, str]]:
    """The texts of a pairs table's rows (`pair_table_items`' layout, also a frozen user pair table's)."""
    ids = table["pair_id"].to_pylist()
    yield from _pair_texts(zip(ids, table["query"].to_pylist(), table["positive"].to_pylist()))
    if "negatives" in table.column_names:
        for pair_id, texts in zip(ids, table["negatives"].to_pylist()):
            for i, text in enumerate(texts):
                yield f"{pair_id}:negative:{i}", text


def mined_set_items(directory: Path) -> Iterator[tuple[str, str]]:
    """The negative texts of one mined set (`directory/negatives.parquet`), as
    "<set>:<pair id>:<doc id>"."""
    directory = Path(directory)
    table = pq.read_table(directory / NEGATIVES_FILE, columns=["pair_id", "doc_id", "negative"])
    for pair_id, doc_id, text in zip(*(table[c].to_pylist() for c in ("pair_id", "doc_id", "negative"))):
        yield f"{directory.name}:{pair_id}:{doc_id}", text


def _mined(prepared: PreparedData) -> Iterator[tuple[str, str]]:
    for path in sorted((prepared.directory / "mined").glob(f"*/{NEGATIVES_FILE}")):
        yield from mined_set_items(path.parent)


def _teacher_sets(prepared: PreparedData) -> Iterator[tuple[str, str]]:
    for path in sorted((prepared.directory / "teacher-labels").glob(f"*/{LABELS_FILE}")):
        yield from teacher_label_items(path.parent)
    for path in sorted((prepared.directory / "teacher-embeddings").glob(f"*/{EMBEDDINGS_FILE}")):
        yield from teacher_embedding_items(path.parent)


def training_stages(
    prepared: PreparedData, stages: tuple[str, ...] = PHASE1_STAGES, *,
    user_pairs: Callable[[], Iterator[tuple[str, str]]] | None = None,
) -> dict[str, Iterator[tuple[str, str]]]:
    """Lazy (id, text) streams for the named stages; `user_pairs` (the items of a spec's user
    pair sources, which the prepared record does not hold: `contamination.run_audit` freezes
    and reads them) is called for the contrastive-pairs stage after the built-in pairs."""
    unknown = sorted(set(stages) - set(ALL_STAGES))
    if unknown:
        raise ValueError(f"unknown stages {unknown}; valid: {list(ALL_STAGES)}")
    sample_ids = set(pq.read_table(prepared.tokenizer_sample_path)["doc_id"].to_pylist())
    streams = {
        "pretraining": lambda: _documents(prepared, None),
        "tokenizer-sample": lambda: _documents(prepared, sample_ids),
        PAIRS_STAGE: lambda: _pairs(prepared, user_pairs),
        MINED_STAGE: lambda: _mined(prepared),
        TEACHER_STAGE: lambda: _teacher_sets(prepared),
    }
    return {name: streams[name]() for name in stages}
