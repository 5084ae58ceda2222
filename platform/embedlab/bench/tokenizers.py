"""Compare tokenizer kinds on held-out text: length, truncation, unknowns, byte fallback, speed.

`compare_tokenizers` trains every kind on the same training texts (pass the training split only),
encodes each source's held-out texts and returns one JSON-ready row per kind with these keys:

    kind, vocab_size, hash      the trained tokenizer (actual vocabulary size, sha256 of its file)
    train_documents             how many texts it was trained on
    train_seconds               wall time of training
    max_length                  the model's sequence length the truncation rate is measured at
    documents, characters, tokens, tokens_per_document, tokens_per_1k_chars,
    truncation_rate, unk_rate, byte_fallback_rate
                                over all held-out texts (`SOURCE_KEYS`)
    tokens_per_second, documents_per_second
                                one `encode_batch` call over all held-out texts, timed on this run
    sources                     {source: the `SOURCE_KEYS` for that source's texts alone}
    tokenizer                   `describe()` of the trained tokenizer

Definitions:

    truncation_rate     share of documents with more than max_length - 2 tokens, since [CLS] and
                        [SEP] take two of the max_length positions (as in `evaluate.encode`)
    unk_rate            [UNK] tokens / all tokens
    byte_fallback_rate  byte-level only (None for the others, which have no bytes to fall back on):
                        share of tokens that are one non-ASCII byte, i.e. a piece of a character no
                        vocabulary entry covers, spelled out byte by byte. It is byte-level's
                        counterpart of UNK; a merged multi-byte piece of a character is not counted.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import decoders, pre_tokenizers

from embedlab.sources.document import document_texts
from embedlab.tokenizer.frozen import (
    TOKENIZER_KINDS,
    FrozenTokenizer,
    check_kind,
    describe,
    save_tokenizer,
    train_tokenizer,
)

SOURCE_KEYS = (
    "documents",
    "characters",
    "tokens",
    "tokens_per_document",
    "tokens_per_1k_chars",
    "truncation_rate",
    "unk_rate",
    "byte_fallback_rate",
)
ROW_KEYS = (
    "kind",
    "vocab_size",
    "hash",
    "train_documents",
    "train_seconds",
    "max_length",
    *SOURCE_KEYS,
    "tokens_per_second",
    "documents_per_second",
    "sources",
    "tokenizer",
)


def compare_tokenizers(
    train_texts: list[str],
    eval_texts_by_source: dict[str, list[str]],
    *,
    vocab_size: int,
    max_length: int,
    kinds: Sequence[str] = TOKENIZER_KINDS,
    progress: Callable[[str], None] = print,
) -> list[dict]:
    """Train each of `kinds` on `train_texts`; one row of held-out statistics per kind."""
    # Checked up front so a typo fails before minutes of training the kinds listed before it.
    for kind in kinds:
        check_kind(kind)
    if max_length <= 2:
        raise ValueError(f"max_length {max_length} leaves no room besides [CLS] and [SEP]")
    if not train_texts:
        raise ValueError("train_texts is empty")
    empty = [source for source, texts in eval_texts_by_source.items() if not texts]
    if not eval_texts_by_source or empty:
        raise ValueError(f"every evaluation source needs texts; empty: {empty or 'all'}")
    return [
        _compare_one(kind, train_texts, eval_texts_by_source, vocab_size, max_length, progress)
        for kind in kinds
    ]


def _compare_one(
    kind: str,
    train_texts: list[str],
    eval_texts_by_source: dict[str, list[str]],
    vocab_size: int,
    max_length: int,
    progress: Callable[[str], None],
) -> dict:
    """Train one kind, encode every held-out text once, and measure it."""
    progress(f"tokenizer compare: training {kind} (vocab {vocab_size}) on {len(train_texts)} texts")
    start = time.perf_counter()
    trained = train_tokenizer(train_texts, vocab_size, kind=kind)
    train_seconds = time.perf_counter() - start
    # Saved only to get the file hash a checkpoint would record; the tokenizer stays in memory.
    with tempfile.TemporaryDirectory() as directory:
        tokenizer = save_tokenizer(trained, Path(directory))

    # One timed call over every source, as a caller encoding a corpus would make it.
    all_texts = [text for texts in eval_texts_by_source.values() for text in texts]
    progress(f"tokenizer compare: encoding {len(all_texts)} held-out documents with {kind}")
    start = time.perf_counter()
    all_ids = tokenizer.encode_batch(all_texts)
    encode_seconds = time.perf_counter() - start

    fallback_ids = _byte_fallback_ids(tokenizer) if kind == "byte-level" else None
    sources, offset = {}, 0
    for source, texts in eval_texts_by_source.items():
        ids = all_ids[offset : offset + len(texts)]
        sources[source] = _text_stats(texts, ids, tokenizer.unk_id, fallback_ids, max_length)
        offset += len(texts)
    overall = _text_stats(all_texts, all_ids, tokenizer.unk_id, fallback_ids, max_length)
    return {
        "kind": kind,
        "vocab_size": tokenizer.vocab_size,
        "hash": tokenizer.hash,
        "train_documents": len(train_texts),
        "train_seconds": train_seconds,
        "max_length": max_length,
        **overall,
        "tokens_per_second": overall["tokens"] / encode_seconds,
        "documents_per_second": len(all_texts) / encode_seconds,
        "sources": sources,
        "tokenizer": describe(tokenizer),
    }


def _byte_fallback_ids(tokenizer: FrozenTokenizer) -> np.ndarray:
    """Ids of the byte-level tokens that are one non-ASCII byte: not a character on their own."""
    byte_decoder = decoders.ByteLevel()
    # A lone byte >= 0x80 is not valid UTF-8, so it decodes to U+FFFD; an ASCII byte to itself.
    return np.array(
        [
            tokenizer.tokenizer.token_to_id(symbol)
            for symbol in pre_tokenizers.ByteLevel.alphabet()
            if not byte_decoder.decode([symbol]).isascii()
        ]
    )


def _text_stats(
    texts: list[str],
    ids: list[list[int]],
    unk_id: int,
    fallback_ids: np.ndarray | None,
    max_length: int,
) -> dict:
    """The `SOURCE_KEYS` of one set of texts and their token ids."""
    lengths = np.array([len(doc) for doc in ids])
    flat = np.fromiter((i for doc in ids for i in doc), dtype=np.int64, count=int(lengths.sum()))
    tokens = len(flat)
    characters = sum(len(text) for text in texts)
    return {
        "documents": len(texts),
        "characters": characters,
        "tokens": tokens,
        "tokens_per_document": tokens / len(texts),
        "tokens_per_1k_chars": 1000 * tokens / characters if characters else 0.0,
        "truncation_rate": float(np.mean(lengths > max_length - 2)),
        "unk_rate": _share(flat, np.array([unk_id]), tokens),
        "byte_fallback_rate": None if fallback_ids is None else _share(flat, fallback_ids, tokens),
    }


def _share(flat: np.ndarray, wanted: np.ndarray, tokens: int) -> float:
    return float(np.isin(flat, wanted).sum() / tokens) if tokens else 0.0


def format_comparison(rows: list[dict]) -> str:
    """Two aligned text tables: one line per kind, then one per (source, kind)."""
    truncated = f"trunc@{rows[0]['max_length']}"
    per_kind = [
        [
            row["kind"],
            f"{row['vocab_size']:,}",
            f"{row['train_seconds']:.2f}",
            *_length_cells(row),
            f"{row['tokens_per_second']:,.0f}",
            f"{row['documents_per_second']:,.0f}",
        ]
        for row in rows
    ]
    per_source = []
    for source in rows[0]["sources"]:
        for row in rows:
            stats = row["sources"][source]
            documents = f"{stats['documents']:,}"
            per_source.append([source, row["kind"], documents, *_length_cells(stats)])
    lengths = ["tok/doc", "tok/1k chars", truncated, "unk", "byte fb"]
    kind_header = ["kind", "vocab", "train s", *lengths, "tok/s", "docs/s"]
    return "\n\n".join(
        [
            _table(kind_header, per_kind, names=1),
            _table(["source", "kind", "docs", *lengths], per_source, names=2),
        ]
    )


def _length_cells(stats: dict) -> list[str]:
    """Length, truncation, UNK and fallback columns of a row or of one of its sources."""
    fallback = stats["byte_fallback_rate"]
    return [
        f"{stats['tokens_per_document']:.1f}",
        f"{stats['tokens_per_1k_chars']:.1f}",
        f"{stats['truncation_rate']:.1%}",
        f"{stats['unk_rate']:.3%}",
        "n/a" if fallback is None else f"{fallback:.3%}",
    ]


def _table(header: list[str], body: list[list[str]], *, names: int) -> str:
    """Columns padded to width: the first `names` left-aligned, the numbers after them right."""
    lines = [header, *body]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    def pad(i: int, cell: str) -> str:
        return cell.ljust(widths[i]) if i < names else cell.rjust(widths[i])

    return "\n".join("  ".join(pad(i, cell) for i, cell in enumerate(line)) for line in lines)


def compare_corpus_tokenizers(prepared, *, eval_documents_per_source: int = 500, progress=print) -> list[dict]:
    """`compare_tokenizers` on a prepared corpus: trained on the tokenizer's own training-split
    sample, measured on recipe-dev documents of every mixture source (never final-eval ones)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq


    config = prepared.record["config"]
    corpus = prepared.corpus
    sample_ids = pq.read_table(prepared.tokenizer_sample_path)["doc_id"]
    train = corpus.read(split="train").filter(pc.is_in(corpus.read(split="train")["doc_id"], value_set=sample_ids))
    train_texts = document_texts(train)
    dev = corpus.read(split="dev").sort_by([("source", "ascending"), ("hash", "ascending")])
    eval_texts: dict[str, list[str]] = {}
    for source in prepared.record["mixture"]["shares"]:
        rows = dev.filter(pc.equal(dev["source"], source)).slice(0, eval_documents_per_source)
        texts = document_texts(rows)
        if texts:
            eval_texts[source] = texts
    return compare_tokenizers(
        train_texts, eval_texts,
        vocab_size=config["tokenizer_vocab_size"], max_length=config["sequence_length"], progress=progress,
    )
