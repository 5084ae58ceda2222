"""Score an encoder on a retrieval task: encode, exact inner-product search with Faiss, metrics."""

from __future__ import annotations

import time

import numpy as np

from embedlab.evaluate.beir import Task
from embedlab.evaluate.metrics import rank_run, retrieval_metrics

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


def search(doc_embeddings: np.ndarray, query_embeddings: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k with `faiss.IndexFlatIP`: (Q, k) scores and doc rows."""
    faiss = faiss_module()
    index = faiss.IndexFlatIP(doc_embeddings.shape[1])
    index.add(np.ascontiguousarray(doc_embeddings, dtype=np.float32))
    return index.search(np.ascontiguousarray(query_embeddings, dtype=np.float32), min(k, index.ntotal))


def score_embeddings(
    task: Task,
    split: str,
    doc_ids: list[str],
    doc_embeddings: np.ndarray,
    query_ids: list[str],
    query_embeddings: np.ndarray,
) -> dict[str, float]:
    """Metrics of one split from precomputed embeddings (rows aligned with the id lists)."""
    scores, rows = search(doc_embeddings, query_embeddings, TOP_K)
    run = {
        qid: {doc_ids[r]: float(s) for s, r in zip(scores[i], rows[i]) if r >= 0}
        for i, qid in enumerate(query_ids)
    }
    metrics = retrieval_metrics(task.qrels[split], rank_run(run, TOP_K))
    return {**metrics, "docs": len(doc_ids)}


def evaluate_encoder(encode, task: Task, split: str, *, encode_documents=None) -> dict[str, float]:
    """`encode(texts) -> (N, d)` embeddings scored on `task`'s `split` qrels; documents go
    through `encode_documents` when the two sides are encoded differently (prefixes)."""
    started = time.perf_counter()
    doc_ids = sorted(task.corpus)
    queries = task.split_queries(split)
    query_ids = list(queries)
    doc_embeddings = (encode_documents or encode)([task.doc_text(d) for d in doc_ids])
    query_embeddings = encode([queries[q] for q in query_ids])
    metrics = score_embeddings(task, split, doc_ids, doc_embeddings, query_ids, query_embeddings)
    return {**metrics, "split": split, "task": task.name, "task_hash": task.hash,
            "seconds": time.perf_counter() - started}
