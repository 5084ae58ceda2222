"""`embedlab bench eval`: the evaluator's time and nDCG@10 next to sentence-transformers'
`InformationRetrievalEvaluator` on the same model, task and split."""

from __future__ import annotations

import time
from collections.abc import Callable

from embedlab.core.beir import load_task
from embedlab.core.config import DataConfig
from embedlab.prepared.build import prepare_data
from embedlab.tasks.baselines import MiniLM, minilm_path
from embedlab.tasks.retrieval import evaluate_encoder


def bench_eval(split: str = "dev", progress: Callable[[str], None] = print) -> dict:
    """The evaluator's time to score all-MiniLM-L6-v2 on the built-in task next to
    sentence-transformers' `InformationRetrievalEvaluator` on the same model, task and split,
    with both nDCG@10 values. Models are loaded before either clock starts."""
    # Here: sentence-transformers (and the transformers it loads) is the reference only, heavy to import.
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    prepared = prepare_data(DataConfig(), progress=progress)
    task = load_task(prepared.task_dir("python-docstrings"))
    ours = MiniLM(device="cpu")
    reference_model = SentenceTransformer(str(minilm_path()), device="cpu")
    queries = task.split_queries(split)
    relevant = {q: {d for d, grade in task.qrels[split][q].items() if grade > 0} for q in queries}
    evaluator = InformationRetrievalEvaluator(
        queries=queries, corpus={d: task.doc_text(d) for d in task.corpus}, relevant_docs=relevant,
        ndcg_at_k=[10], mrr_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[100], map_at_k=[100],
        batch_size=64, show_progress_bar=False,
    )
    progress(f"bench eval: all-MiniLM-L6-v2 on python-docstrings/{split}: {len(queries)} queries, {len(task.corpus)} documents")
    started = time.perf_counter()
    metrics = evaluate_encoder(ours.encode, task, split)
    ours_seconds = time.perf_counter() - started
    started = time.perf_counter()
    reference = evaluator(reference_model)
    reference_seconds = time.perf_counter() - started
    reference_ndcg = next(v for k, v in reference.items() if k.endswith("ndcg@10"))
    return {
        "task": task.name, "split": split, "queries": len(queries), "docs": len(task.corpus),
        "comparisons": [{
            "name": "eval: seconds per task",
            "embedlab": ours_seconds,
            "embedlab_measures": "embedlab evaluator: length-sorted encoding, Faiss IndexFlatIP, trec_eval metrics + health",
            "reference": reference_seconds,
            "reference_measures": "sentence-transformers InformationRetrievalEvaluator (same model, cosine)",
            "ratio": ours_seconds / reference_seconds,
            "unit": "s",
        }],
        "ndcg@10": {"embedlab": metrics["ndcg@10"], "reference": float(reference_ndcg)},
    }


def format_bench_eval(result: dict) -> str:
    c = result["comparisons"][0]
    return "\n".join([
        f"{'comparison':<26} {'embedlab':>10} {'reference':>10} {'ratio':>7}  unit",
        f"{c['name']:<26} {c['embedlab']:>10.2f} {c['reference']:>10.2f} {c['ratio']:>7.3f}  {c['unit']}",
        f"{'nDCG@10':<26} {result['ndcg@10']['embedlab']:>10.4f} {result['ndcg@10']['reference']:>10.4f}",
        "",
        f"embedlab:  {c['embedlab_measures']}",
        f"reference: {c['reference_measures']}",
        f"{result['task']}/{result['split']}: {result['queries']} queries, {result['docs']} documents",
    ])
