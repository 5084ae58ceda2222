"""Score an encoder on a retrieval task: encode, exact inner-product search with Faiss, metrics."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from embedlab.core.beir import Task
from embedlab.tasks.health import health_report
from embedlab.tasks.metrics import METRIC_NAMES, by_metric, mean_metrics, per_query_metrics, rank_run

TOP_K = 100


FAISS_DISTRIBUTIONS = ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "faiss-gpu-cu11")


def installed_faiss_distributions() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in FAISS_DISTRIBUTIONS:
        try:
            version(name)
        except PackageNotFoundError:
            continue
        found.append(name)
    return found


def check_one_faiss(installed: list[str]) -> None:
    """faiss-cpu and faiss-gpu overwrite each other's `faiss` module: exactly one may be installed."""
    if len(installed) > 1:
        raise ImportError(
            f"several faiss distributions are installed ({', '.join(installed)}); they overwrite "
            "each other's `faiss` module. Uninstall all of them, then install exactly one "
            "(pip install 'embedlab[cpu]' or 'embedlab[gpu]')"
        )
    if not installed:
        raise ImportError(
            "faiss is not installed: install embedlab with exactly one of the extras "
            "`cpu` (faiss-cpu) or `gpu` (faiss-gpu)"
        )


def faiss_module():
    """`faiss`, after checking that exactly one faiss distribution provides it."""
    check_one_faiss(installed_faiss_distributions())
    import faiss

    return faiss


INDEX_KINDS = ("flat", "ivf", "hnsw")


def build_index(doc_embeddings: np.ndarray, kind: str = "flat", *, use_gpu: bool | None = None):
    """A Faiss inner-product index over (N, d) unit rows.

    "flat": exact (`IndexFlatIP`, the default). "ivf": `IndexIVFFlat` with about 4*sqrt(N)
    lists trained on the corpus and nprobe = lists/4 (at least 16), for large corpora.
    "hnsw": `IndexHNSWFlat` (M=32, efSearch=128). Approximate kinds trade a little recall
    for speed; reports must say which was used. With faiss-gpu and a visible GPU the index
    moves to all GPUs (`use_gpu=None` decides by what is available); HNSW stays on the CPU.
    """
    faiss = faiss_module()
    if kind not in INDEX_KINDS:
        raise ValueError(f"index kind {kind!r}; valid: {list(INDEX_KINDS)}")
    vectors = np.ascontiguousarray(doc_embeddings, dtype=np.float32)
    count, dim = vectors.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "ivf":
        lists = max(1, min(count // 39, int(4 * np.sqrt(count))))  # faiss wants >= 39 points per list
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        index.nprobe = max(16, lists // 4)
    else:
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = 128
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if kind != "hnsw" and gpus > 0 and use_gpu is not False:
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(vectors)
    return index


def search(
    doc_embeddings: np.ndarray, query_embeddings: np.ndarray, k: int, kind: str = "flat"
) -> tuple[np.ndarray, np.ndarray]:
    """Inner-product top-k: (Q, k) scores and doc rows (row -1 where fewer were found)."""
    index = build_index(doc_embeddings, kind)
    return index.search(np.ascontiguousarray(query_embeddings, dtype=np.float32), min(k, index.ntotal))


def score_embeddings(
    task: Task,
    split: str,
    doc_ids: list[str],
    doc_embeddings: np.ndarray,
    query_ids: list[str],
    query_embeddings: np.ndarray,
    index: str = "flat",
) -> dict[str, Any]:
    """Metrics of one split from precomputed embeddings (rows aligned with the id lists):
    their means, and under "per_query" each query's values (``{metric: {query_id: value}}``),
    the numbers those means average, computed once for both."""
    scores, rows = search(doc_embeddings, query_embeddings, TOP_K, index)
    run = {
        qid: {doc_ids[r]: float(s) for s, r in zip(scores[i], rows[i]) if r >= 0}
        for i, qid in enumerate(query_ids)
    }
    per_query = per_query_metrics(task.qrels[split], rank_run(run, TOP_K))
    return {**mean_metrics(per_query), "docs": len(doc_ids), "index": index, "per_query": by_metric(per_query)}


def truncated(embeddings: np.ndarray, width: int) -> np.ndarray:
    """(N, d) embeddings -> their first `width` coordinates, re-normalised to unit rows (a zero
    row stays zero): the embedding a Matryoshka-trained encoder gives at that width."""
    if not 1 <= width <= embeddings.shape[1]:
        raise ValueError(f"truncation width must be in 1..{embeddings.shape[1]}, got {width}")
    prefix = np.ascontiguousarray(embeddings[:, :width], dtype=np.float32)
    norms = np.linalg.norm(prefix, axis=1, keepdims=True)
    return prefix / np.maximum(norms, 1e-12)


def evaluate_encoder(encode, task: Task, split: str, *, encode_documents=None, index: str = "flat",
                     dims: tuple[int, ...] = ()) -> dict[str, Any]:
    """`encode(texts) -> (N, d)` embeddings scored on `task`'s `split` qrels; documents go
    through `encode_documents` when the two sides are encoded differently (prefixes). The
    metrics are means; "per_query" holds what they average (`score_embeddings`). Each width
    of `dims` is scored too, on both sides' embeddings truncated to it and re-normalised
    (`truncated`), with the same index kind: `dim<width>/<metric>` beside the full width's
    metrics, and in "per_query" under the same names. The texts are encoded once."""
    started = time.perf_counter()
    doc_ids = sorted(task.corpus)
    queries = task.split_queries(split)
    query_ids = list(queries)
    doc_embeddings = (encode_documents or encode)([task.doc_text(d) for d in doc_ids])
    query_embeddings = encode([queries[q] for q in query_ids])
    metrics = score_embeddings(task, split, doc_ids, doc_embeddings, query_ids, query_embeddings, index)
    for width in dims:
        at = score_embeddings(task, split, doc_ids, truncated(doc_embeddings, width), query_ids,
                              truncated(query_embeddings, width), index)
        metrics.update({f"dim{width}/{name}": at[name] for name in METRIC_NAMES})
        metrics["per_query"].update({f"dim{width}/{name}": at["per_query"][name] for name in METRIC_NAMES})
    row_of = {doc_id: row for row, doc_id in enumerate(doc_ids)}
    positives = [[row_of[d] for d, grade in task.qrels[split][q].items() if grade > 0 and d in row_of]
                 for q in query_ids]
    health = health_report(doc_embeddings, queries=query_embeddings, positives=positives)
    return {**metrics, **health, "split": split, "task": task.name, "task_hash": task.hash,
            "seconds": time.perf_counter() - started}
