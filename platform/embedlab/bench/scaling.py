"""`embedlab bench --scaling`: how training and evaluation time grow.

Training: phase-1 tokens/s at row lengths 128, 512, 1024 and 2048 on the same documents (see
`bench.train.tokens_per_second_by_length`), on both attention paths.

Evaluation: seconds to evaluate a corpus of N documents = encoding N documents + building
the Faiss index and searching it (the evaluator's `build_index` / `search`, exact inner
product, top 100) for a fixed query set. Encoding is measured with the real encoder
(`encode_texts`, the preset at random weights; cost does not depend on the weights) on real
training documents up to `encode_limit`; beyond that it is extrapolated at the measured
documents/s of the largest measured size, and the table says so. Index and search are
measured at every size, up to 1M documents, on random unit vectors of the model's width
(search cost depends on the sizes, not on the values).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from embedlab.bench.train import tokens_per_second_by_length
from embedlab.core.config import model_preset
from embedlab.model.encode import encode_texts
from embedlab.model.encoder import Encoder
from embedlab.sources.document import document_texts
from embedlab.tasks.retrieval import TOP_K, search

CORPUS_SIZES = (1_000, 10_000, 100_000, 1_000_000)
ENCODE_LIMIT = 100_000  # the built-in corpus has about 147k training documents to encode


def eval_time_by_corpus_size(prepared, sizes: tuple[int, ...] = CORPUS_SIZES, encode_limit: int = ENCODE_LIMIT,
                             queries: int = 500, preset: str = "small", threads: int = 1,
                             progress: Callable[[str], None] = print) -> list[dict]:
    torch.set_num_threads(threads)
    config = model_preset(preset)
    torch.manual_seed(0)
    encoder = Encoder(config).eval()
    tokenizer = prepared.tokenizer
    sources = list(prepared.record["mixture"]["shares"])
    table = prepared.corpus.read(split="train", sources=sources).sort_by("hash")
    rng = np.random.default_rng(0)
    query_vectors = _unit(rng.standard_normal((queries, config.width), dtype=np.float32))
    rows, docs_per_second = [], None
    for size in sizes:
        row: dict = {"documents": size}
        if size <= min(encode_limit, table.num_rows):
            texts = document_texts(table.slice(0, size))
            started = time.perf_counter()
            encode_texts(encoder, tokenizer, texts, batch_size=64, max_length=128)
            row["encode_seconds"] = time.perf_counter() - started
            row["encode"] = "measured"
            docs_per_second = size / row["encode_seconds"]
        else:
            row["encode_seconds"] = size / docs_per_second
            row["encode"] = f"extrapolated at {docs_per_second:,.0f} docs/s"
        vectors = _unit(rng.standard_normal((size, config.width), dtype=np.float32))
        started = time.perf_counter()
        search(vectors, query_vectors, TOP_K)
        row["search_seconds"] = time.perf_counter() - started
        row["total_seconds"] = row["encode_seconds"] + row["search_seconds"]
        del vectors
        progress(f"bench scaling: {size:,} documents: encode {row['encode_seconds']:.2f}s ({row['encode']}), "
                 f"index + search {row['search_seconds']:.2f}s")
        rows.append(row)
    return rows


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def bench_scaling(prepared, *, lengths: tuple[int, ...] = (128, 512, 1024, 2048), sizes: tuple[int, ...] = CORPUS_SIZES,
                  length_preset: str = "tiny", length_tokens: int = 16384, encode_limit: int = ENCODE_LIMIT,
                  repeats: int = 3, threads: int = 1, progress: Callable[[str], None] = print) -> dict:
    return {
        "length": tokens_per_second_by_length(prepared, lengths, preset=length_preset, tokens=length_tokens,
                                              repeats=repeats, threads=threads, progress=progress),
        "corpus": eval_time_by_corpus_size(prepared, sizes, encode_limit=encode_limit, threads=threads,
                                           progress=progress),
    }


def format_scaling(result: dict) -> str:
    """Two markdown tables, as docs/results/benchmarks.md carries them."""
    first = result["length"][0]
    lines = [f"Training tokens/s by row length (preset `{first['preset']}`, packed rows, same documents):", "",
             "| length | dense SDPA mask | varlen | varlen / dense |", "|---:|---:|---:|---:|"]
    for row in result["length"]:
        lines.append(f"| {row['sequence_length']} | {row['dense']:,.0f} | {row['varlen']:,.0f} | "
                     f"{row['varlen'] / row['dense']:.2f} |")
    lines += ["", "Evaluation seconds by corpus size (encode + exact Faiss index and top-100 search):", "",
              "| documents | encode s | index + search s | total s | encode |", "|---:|---:|---:|---:|---|"]
    for row in result["corpus"]:
        lines.append(f"| {row['documents']:,} | {row['encode_seconds']:.2f} | {row['search_seconds']:.2f} | "
                     f"{row['total_seconds']:.2f} | {row['encode']} |")
    return "\n".join(lines)
