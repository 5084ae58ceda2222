"""Mining across the cluster: the parent's encoding and the exact search on Ray workers.

Encoding (`encode_on_workers`) runs as Ray Data batches over a pool of encoder actors, each
loading the parent once. The texts are cut into exactly the batches one process would encode
(`embedlab.model.encode.length_order`, runs of `batch_size`), and each batch is encoded whole
by one actor, so every text meets the same padded shape it would meet in one process (torch's
CPU kernels give the same vectors whatever thread count a worker has; `tests/test_shared_mining.py`).

The search (`search_on_workers`) puts the document vectors in the object store once; each of N
tasks builds the flat index from them once and searches its share of the fixed query blocks
(`embedlab.negatives.search`), single-threaded, as one process searches each block, so the
candidates, their scores and the order of ties are identical to one process's.

Both return what they cost: the encoder's FLOPs (`FlopTally`, per batch) and the workers'
thread-CPU seconds, summed, so a sharded mining's cost is comparable with one process's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from embedlab.checkpoints.io import load_encoder
from embedlab.model.encode import content_ids, encode_texts, length_order
from embedlab.model.flops import FlopTally
from embedlab.negatives.search import flat_index, query_blocks, search_blocks

ENCODE_BATCH = 64  # texts per encoder batch: `encode_texts`'s default, so batches match one process


@dataclass
class WorkerCost:
    """What the workers spent on one mining: encoder FLOPs and thread-CPU seconds, added as they report."""

    flops: float = 0.0
    seconds: float = 0.0
    passes: list[str] = field(default_factory=list)

    def add(self, flops: float, seconds: float, what: str) -> None:
        self.flops += flops
        self.seconds += seconds
        self.passes.append(what)


@dataclass(frozen=True, kw_only=True)
class Workers:
    """How many Ray workers mine and what each asks Ray for (`{"num_cpus": 1}`, or a GPU)."""

    count: int
    resources: dict[str, float] = field(default_factory=lambda: {"num_cpus": 1})


class _BatchEncoder:
    """A Ray Data actor: the parent checkpoint loaded once, then whole batches of texts encoded."""

    def __init__(self, checkpoint: str, *, max_length: int, pooling: str, prefix: str) -> None:
        import torch

        self.encoder, self.tokenizer, _ = load_encoder(checkpoint)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.encoder.to(self.device)
        self.max_length, self.pooling, self.prefix = max_length, pooling, prefix

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, vectors, flops, seconds = [], [], [], []
        for positions, texts in zip(batch["rows"], batch["texts"]):
            tally, started = FlopTally(), time.thread_time()
            vectors.append(encode_texts(self.encoder, self.tokenizer, list(texts), batch_size=len(texts),
                                        max_length=self.max_length, pooling=self.pooling, prefix=self.prefix,
                                        device=self.device, tally=tally))
            rows.append(np.asarray(positions, dtype=np.int64))
            # The batch's cost on its first row, so the column sums to what the batch cost.
            flops.append(np.array([tally.flops] + [0.0] * (len(texts) - 1)))
            seconds.append(np.array([time.thread_time() - started] + [0.0] * (len(texts) - 1)))
        return {"row": np.concatenate(rows), "vector": np.concatenate(vectors),
                "flops": np.concatenate(flops), "seconds": np.concatenate(seconds)}


def text_batches(tokenizer, texts: list[str], *, max_length: int, prefix: str,
                 batch_size: int = ENCODE_BATCH) -> list[list[int]]:
    """The input positions of each batch one process's `encode_texts` would encode, in its order."""
    order = length_order(content_ids(tokenizer, texts, max_length=max_length, prefix=prefix))
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def encode_on_workers(checkpoint: str, tokenizer, texts: list[str], *, max_length: int, pooling: str, prefix: str,
                      workers: Workers, cost: WorkerCost | None = None, label: str = "encoding",
                      progress: Callable[[str], None] = print) -> np.ndarray:
    """(N, d) float32 unit rows of `texts` under the checkpoint's encoder, as `encode_texts`
    gives them in one process, encoded by `workers.count` Ray Data actors; their FLOPs and CPU
    seconds added to `cost`."""
    import ray.data

    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    batches = text_batches(tokenizer, texts, max_length=max_length, prefix=prefix)
    progress(f"{label}: {len(texts):,} texts in {len(batches):,} batches on {workers.count} Ray workers")
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    items = ray.data.from_items([{"rows": rows, "texts": [texts[i] for i in rows]} for rows in batches],
                                override_num_blocks=min(len(batches), 4 * workers.count))
    encoded = items.map_batches(
        _BatchEncoder, batch_size=1, batch_format="numpy", concurrency=min(workers.count, len(batches)),
        fn_constructor_kwargs={"checkpoint": checkpoint, "max_length": max_length, "pooling": pooling,
                               "prefix": prefix}, **workers.resources)
    out: np.ndarray | None = None
    flops = seconds = 0.0
    for part in encoded.iter_batches(batch_format="numpy", batch_size=None):
        if out is None:
            out = np.zeros((len(texts), part["vector"].shape[1]), dtype=np.float32)
        out[part["row"]] = part["vector"]
        flops += float(part["flops"].sum())
        seconds += float(part["seconds"].sum())
    if cost is not None:
        cost.add(flops, seconds, label)
    return out


def _search_share(doc_vectors: np.ndarray, query_vectors: np.ndarray, top_k: int,
                  blocks: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, float]:
    """One worker's share: the index built once from the shared vectors, its blocks searched."""
    started = time.thread_time()
    scores, rows = search_blocks(doc_vectors, query_vectors, top_k, blocks, index=flat_index(doc_vectors))
    return scores, rows, time.thread_time() - started


def search_on_workers(doc_vectors: np.ndarray, query_vectors: np.ndarray, top_k: int, *, workers: Workers,
                      cost: WorkerCost | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`embedlab.negatives.mining.exact_search` over `workers.count` Ray tasks: the fixed query
    blocks dealt round-robin, each task searching its blocks of one shared index, the results
    put back in block order. The same scores and rows as one process, bit for bit."""
    blocks = query_blocks(len(query_vectors))
    shares = [blocks[w::workers.count] for w in range(min(workers.count, len(blocks)))]
    docs, queries = ray.put(np.ascontiguousarray(doc_vectors)), ray.put(np.ascontiguousarray(query_vectors))
    search_share = ray.remote(_search_share).options(**workers.resources)
    found = ray.get([search_share.remote(docs, queries, top_k, share) for share in shares])
    k = min(top_k, len(doc_vectors))
    scores = np.zeros((len(query_vectors), k), dtype=np.float32)
    rows = np.full((len(query_vectors), k), -1, dtype=np.int64)
    for share, (share_scores, share_rows, _) in zip(shares, found):
        at = 0
        for start, stop in share:
            scores[start:stop], rows[start:stop] = share_scores[at:at + stop - start], share_rows[at:at + stop - start]
            at += stop - start
    if cost is not None:
        cost.add(0.0, sum(seconds for _, _, seconds in found), "search")
    return scores, rows


def worker_encoders(checkpoint: str, tokenizer, *, max_length: int, pooling: str, prefixes: dict[str, str],
                    workers: Workers, cost: WorkerCost, progress: Callable[[str], None],
                    label: str) -> tuple[Callable[[list[str]], np.ndarray], Callable[[list[str]], np.ndarray]]:
    """`encode(texts)` (passages) and `encode_query(texts)` on the workers, as mining calls them."""
    def encoder(prefix: str, what: str) -> Callable[[list[str]], np.ndarray]:
        def encode(texts: list[str]) -> np.ndarray:
            return encode_on_workers(checkpoint, tokenizer, texts, max_length=max_length, pooling=pooling,
                                     prefix=prefix, workers=workers, cost=cost, label=f"{label} {what}",
                                     progress=progress)
        return encode

    return encoder(prefixes["passage"], "passages"), encoder(prefixes["query"], "queries")


def workers_for(count: int, use_gpu: bool) -> Workers:
    """`count` workers of one CPU each, or of one GPU each for a trial that trains on GPUs."""
    return Workers(count=count, resources={"num_gpus": 1} if use_gpu else {"num_cpus": 1})


def cost_record(cost: WorkerCost, workers: Workers) -> dict[str, Any]:
    """The workers' part of a mining's cost record."""
    return {"flops": cost.flops, "seconds": cost.seconds, "workers": workers.count,
            "resources": dict(workers.resources), "passes": list(cost.passes)}
