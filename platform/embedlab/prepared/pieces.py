"""The frozen pieces of a prepared data directory: its training text, tokenised once on Ray Data.

    read       the frozen corpus's training documents of the mixture's sources
               (documents.parquet) as Ray Data blocks, a multiple of the cluster's CPUs
               (`document_blocks`), so tokenising runs in parallel tasks
    tokenize   `map_batches(tokenize_pieces)`: training-split documents of the mixture's
               sources -> pieces of at most L tokens (tokens + SEP, never truncated);
               done once per prepared data directory and frozen as `pieces.parquet`

Pieces are stored in a canonical order (source, doc_id, piece), so a schedule of piece
indices names the same text on every machine and run (`embedlab.streams.packed` samples and
packs them).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from embedlab.artifacts.sync import node_path
from embedlab.sources.document import document_texts
from embedlab.tokenizer.frozen import FrozenTokenizer, load_tokenizer

PIECES_FILE = "pieces.parquet"
# Positions a packed row's segment spends on its opener (CLS): a piece holds at most L - this
# many tokens, so a full piece fills a row whole (`embedlab.streams.packing`).
OPENER_POSITIONS = 1
BLOCK_ROWS = 8192  # documents per tokenising task at most
DOCUMENT_COLUMNS = ("doc_id", "source", "split", "title", "text")  # what tokenize_pieces reads
_tokenizers: dict[str, FrozenTokenizer] = {}


def cached_tokenizer(path: str) -> FrozenTokenizer:
    """The tokenizer at `path`, loaded once per worker process."""
    if path not in _tokenizers:
        _tokenizers[path] = load_tokenizer(node_path(path))
    return _tokenizers[path]


def tokenize_pieces(
    batch: pa.Table, *, tokenizer_path: str, sequence_length: int, sources: list[str]
) -> pa.Table:
    """Ray Data UDF: training-split documents of `sources` -> one row per piece.

    Each document becomes its tokens + SEP, cut into pieces of at most `sequence_length` - 1
    (`embedlab.streams.packing.chunk_document`; the position left is the CLS that packing opens
    every segment with, `OPENER_POSITIONS`, so a full piece fills a row whole), with a
    word-start flag per token. Only
    `encode_batch` runs per document; the cutting and flagging are array operations over
    the whole batch, so this step costs little more than tokenising.
    """
    keep = pc.and_(pc.equal(batch["split"], "train"), pc.is_in(batch["source"], pa.array(sources)))
    batch = batch.filter(keep)
    tokenizer = cached_tokenizer(tokenizer_path)
    encodings = tokenizer.tokenizer.encode_batch(document_texts(batch), add_special_tokens=False)
    lengths = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
    streams = lengths + 1  # each document's tokens and its SEP
    total = int(streams.sum())
    document = np.repeat(np.arange(len(encodings)), streams)  # (total,) the document of each position
    within = np.arange(total) - np.repeat(np.cumsum(streams) - streams, streams)  # position in its document
    is_sep = within == lengths[document]
    ids = np.full(total, tokenizer.sep_id, dtype=np.int32)
    ids[~is_sep] = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int32,
                               count=total - len(encodings))
    # A token starts a word when its pre-tokenizer word differs from the previous token's;
    # whole-word and span masking select in units of these words. SEP counts as a start.
    words = np.fromiter(itertools.chain.from_iterable(e.word_ids for e in encodings), dtype=np.int64,
                        count=total - len(encodings))
    token_starts = np.ones(len(words), dtype=np.int8)
    token_starts[1:] = words[1:] != words[:-1]
    starts = np.ones(total, dtype=np.int8)
    starts[~is_sep] = token_starts
    # Pieces: every `piece` positions of a document; a piece that begins inside a word begins
    # a word of its own (a new segment), so its first flag is set.
    piece = sequence_length - OPENER_POSITIONS
    if piece < 1:
        raise ValueError(f"sequence_length {sequence_length}: no room for a token beside the row's CLS")
    first = np.flatnonzero(within % piece == 0)
    starts[first] = 1
    piece_document = document[first]
    offsets = pa.array(np.append(first, total).astype(np.int32))
    return pa.table(
        {
            "source": batch["source"].take(pa.array(piece_document)).cast(pa.string()),
            "doc_id": batch["doc_id"].take(pa.array(piece_document)).cast(pa.string()),
            "piece": pa.array((within[first] // piece).astype(np.int32)),
            "ids": pa.ListArray.from_arrays(offsets, pa.array(ids)),
            "word_start": pa.ListArray.from_arrays(offsets, pa.array(starts)),
            "doc_tokens": pa.array(streams[piece_document].astype(np.int32)),
        }
    )


def document_blocks(documents: pa.Table, parallelism: int, max_rows: int = BLOCK_ROWS) -> list[pa.Table]:
    """`documents` cut into consecutive blocks of equal size: a multiple of `parallelism` of
    them (one per CPU at a time, so each task's Python work overlaps another task's
    tokenising) and none longer than `max_rows` (which bounds a task's memory).
    `ray.data.read_parquet` would read a single-file corpus as one block, which tokenises in
    one task."""
    if parallelism < 1 or max_rows < 1:
        raise ValueError(f"document_blocks needs parallelism >= 1 and max_rows >= 1, got {parallelism}, {max_rows}")
    # A multiple of `parallelism` blocks of equal size, so no task runs alone at the end.
    count = parallelism * max(1, -(-documents.num_rows // (parallelism * max_rows)))
    count = min(count, max(documents.num_rows, 1))  # never an empty block beside full ones
    bounds = np.linspace(0, documents.num_rows, count + 1).round().astype(int)
    return [documents.slice(start, stop - start) for start, stop in zip(bounds[:-1], bounds[1:])] or [documents]


def cluster_cpus() -> int:
    """CPUs of the connected Ray cluster (this machine's when Ray is not started yet)."""
    import os

    import ray

    if ray.is_initialized():
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    return os.cpu_count() or 1


def tokenize_dataset(documents: pa.Table, *, tokenizer_path: str, sequence_length: int, sources: list[str]):
    """The Ray Data `tokenize` stage over `documents` (see `tokenize_pieces`)."""
    import ray.data

    return ray.data.from_arrow(document_blocks(documents, cluster_cpus())).map_batches(
        tokenize_pieces,
        fn_kwargs={"tokenizer_path": tokenizer_path, "sequence_length": sequence_length, "sources": sources},
        batch_format="pyarrow",
        batch_size=None,  # one batch per block: a batch size would bundle small blocks into one task
        # A whole CPU per task: encode_batch already runs a thread per core, and half-CPU
        # tasks (four at once on two cores) tokenised at under half the speed (`bench data`).
        num_cpus=1,
    )


def build_pieces(
    documents_path: Path,
    tokenizer_path: Path,
    *,
    sequence_length: int,
    sources: list[str],
    out_path: Path,
    progress: Callable[[str], None] = print,
) -> pa.Table:
    """Tokenise the corpus on Ray Data and freeze the pieces in canonical order."""
    import ray

    # Only what is tokenised, so equal blocks hold equal work (the corpus is stored by source).
    documents = pq.read_table(documents_path, columns=list(DOCUMENT_COLUMNS),
                              filters=[("split", "==", "train"), ("source", "in", list(sources))])
    dataset = tokenize_dataset(documents, tokenizer_path=str(tokenizer_path), sequence_length=sequence_length,
                               sources=sources)
    tables = [t for t in (ray.get(ref) for ref in dataset.to_arrow_refs()) if t.num_rows]
    pieces = pa.concat_tables(tables).sort_by(
        [("source", "ascending"), ("doc_id", "ascending"), ("piece", "ascending")]
    )
    pieces = pieces.append_column("tokens", pc.list_value_length(pieces["ids"]).cast(pa.int32()))
    pq.write_table(pieces, out_path)
    progress(f"data: {pieces.num_rows:,} pieces of <= {sequence_length} tokens from "
             f"{len(set(pieces['doc_id'].to_pylist())):,} training documents")
    return pieces


def piece_stats(pieces: pa.Table, sequence_length: int) -> dict[str, dict]:
    """Per source: documents, pieces, tokens and the share of documents longer than one
    piece (L - 1 tokens beside the row's CLS), which continue in further pieces."""
    stats: dict[str, dict] = {}
    first = pieces.filter(pc.equal(pieces["piece"], 0))
    for source in sorted(set(pieces["source"].to_pylist())):
        docs = first.filter(pc.equal(first["source"], source))
        mine = pieces.filter(pc.equal(pieces["source"], source))
        doc_tokens = docs["doc_tokens"].to_numpy()
        stats[source] = {
            "documents": int(docs.num_rows),
            "pieces": int(mine.num_rows),
            "tokens": int(pc.sum(mine["tokens"]).as_py()),
            "truncation_frequency": float((doc_tokens > sequence_length - OPENER_POSITIONS).mean()),
        }
    return stats
