"""Mining's exact search, cut into blocks that give the same result in any process.

Faiss's flat inner-product search is exact, but the last bits of a score depend on how Faiss
computes it: how many queries one call holds (its BLAS path blocks them) and how many OpenMP
threads it runs on (both change the summation order of a dot product at widths of 128 and up).
Two processes that search the same vectors differently may then order two nearly tied
candidates differently. So mining searches in fixed blocks: queries `QUERY_BLOCK` at a time,
the same cut whatever runs them (`query_blocks`), each block one Faiss call on one thread
(`search_blocks`). One process runs the blocks in turn; N workers run them in parallel
(`embedlab.negatives.sharded`); every block is the same call on the same inputs, so the scores,
the rows and the order of ties (Faiss's own) are identical, bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np

from embedlab.tasks.retrieval import build_index, faiss_module

QUERY_BLOCK = 1024  # queries one Faiss call searches


def query_blocks(queries: int, block: int = QUERY_BLOCK) -> list[tuple[int, int]]:
    """The (start, stop) query rows of each block: `block` at a time, the last one shorter."""
    return [(start, min(start + block, queries)) for start in range(0, queries, block)]


@contextlib.contextmanager
def one_faiss_thread() -> Iterator[None]:
    """Faiss (and the BLAS it calls) on one OpenMP thread in this block, restored after."""
    faiss = faiss_module()
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(threads)


def search_blocks(doc_vectors: np.ndarray, query_vectors: np.ndarray, top_k: int,
                  blocks: Sequence[tuple[int, int]], index=None) -> tuple[np.ndarray, np.ndarray]:
    """(queries in `blocks`, min(top_k, documents)) scores and document rows (row -1 where
    fewer were found), the blocks' queries concatenated in their order, each block one
    single-threaded search of a Faiss `IndexFlatIP` over `doc_vectors` on the CPU (a GPU's
    kernels round otherwise), built once (or `index`, built by `flat_index`)."""
    index = flat_index(doc_vectors) if index is None else index
    k = min(top_k, index.ntotal)
    queries = np.ascontiguousarray(query_vectors, dtype=np.float32)
    parts = [(np.zeros((0, k), dtype=np.float32), np.zeros((0, k), dtype=np.int64))]
    with one_faiss_thread():
        parts += [index.search(queries[start:stop], k) for start, stop in blocks]
    return np.concatenate([part[0] for part in parts]), np.concatenate([part[1] for part in parts])


def flat_index(doc_vectors: np.ndarray):
    """The exact inner-product index mining searches, on the CPU."""
    return build_index(doc_vectors, "flat", use_gpu=False)
