"""Scores on the held-out retrieval tasks (`embedlab.evaluate.heldout`): an encoder, BM25 and
all-MiniLM-L6-v2 on each task's test split, by the code `embedlab evaluate` runs
(`evaluate_checkpoint`, `evaluate_baseline`). `embedlab heldout score` prints them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from embedlab import store
from embedlab.evaluate.baselines import evaluate_baseline
from embedlab.evaluate.beir import load_task
from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint
from embedlab.evaluate.heldout import SOURCES_FILE, build_heldout_tasks, heldout_source, read_provenance

SPLIT = "test"
SCORE_KEYS = ("ndcg@10", "recall@100")


def default_heldout_dir() -> Path:
    return store.cache_dir() / "heldout"


def task_dirs(names: list[str], root: Path, progress: Callable[[str], None] = print) -> dict[str, Path]:
    """Each task's directory under `root`, building those not there yet (in one audit pass)."""
    missing = [n for n in names if not (root / n / SOURCES_FILE).is_file()]
    if missing:
        progress(f"heldout: {', '.join(missing)} not built in {root}: building")
        build_heldout_tasks([heldout_source(n) for n in missing], root, progress=progress)
    return {name: root / name for name in names}


def score_tasks(encoder: str | None, names: list[str], root: Path, baselines: list[str], index: str = "flat",
                progress: Callable[[str], None] = print) -> dict:
    """{task: {queries, documents, source, task_hash, directory, scores: {encoder label: metrics}}}:
    nDCG@10 and recall@100 on split `SPLIT` of the encoder (a checkpoint or release directory;
    None: baselines only) and each baseline, on every task named (built under `root` first if
    it is not there)."""
    results = {}
    for name, task_dir in task_dirs(names, root, progress).items():
        task = load_task(task_dir)
        scores = {}
        if encoder is not None:
            progress(f"heldout: {name}: scoring {encoder}")
            metrics = evaluate_checkpoint(encoder, task, SPLIT, index=index)
            scores[encoder] = {**{k: metrics[k] for k in SCORE_KEYS}, "checkpoint_hash": metrics["checkpoint_hash"]}
        for baseline in baselines:
            progress(f"heldout: {name}: scoring {baseline}")
            metrics = evaluate_baseline(baseline, task, SPLIT)
            scores[baseline] = {k: metrics[k] for k in SCORE_KEYS}
        results[name] = {
            "queries": len(task.split_queries(SPLIT)), "documents": len(task.corpus),
            "source": read_provenance(task_dir)["summary"], "task_hash": task.hash, "directory": str(task_dir),
            "scores": scores,
        }
    return results


def format_scores(results: dict) -> str:
    """One table per task of `score_tasks`'s results: its sizes, its source, a row per encoder."""
    blocks = []
    for name, result in results.items():
        width = max([len("encoder"), *(len(label) for label in result["scores"])])
        lines = [
            f"{name}: {result['queries']} queries, {result['documents']} documents (split {SPLIT})",
            f"source: {result['source']}",
            f"{'encoder':<{width}}  {'nDCG@10':>8}  {'recall@100':>10}",
        ]
        lines += [f"{label:<{width}}  {m['ndcg@10']:>8.4f}  {m['recall@100']:>10.4f}"
                  for label, m in result["scores"].items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
