"""Scores on the held-out retrieval tasks (`embedlab.tasks.heldout`): an encoder, BM25 and
all-MiniLM-L6-v2 on each task's test split, by the code `embedlab evaluate` runs
(`evaluate_checkpoint`, `evaluate_baseline`). `embedlab heldout score` prints them.

Each score is also split by query (`word_matched`): the queries whose every word appears in
their relevant documents, which BM25 can match by their words, and the others, which need
what a word means. A model far below BM25 on the first group has not learnt to match a word
with itself; below it on the second only, it lacks the vocabulary's meanings."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

from embedlab.core import store
from embedlab.core.beir import Task, load_task
from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint
from embedlab.tasks.baselines import bm25_tokenize, evaluate_baseline
from embedlab.tasks.heldout import SOURCES_FILE, build_heldout_tasks, heldout_source, read_provenance

SPLIT = "test"
SCORE_KEYS = ("ndcg@10", "recall@100")
# The two groups of `word_matched`, and the metric reported for each (as "ndcg@10/<group>").
WORD_GROUPS = ("words_in_document", "other")
GROUP_METRIC = "ndcg@10"
WORD_MATCH_RULE = ("a query's words are BM25's tokens (lowercased, English stopwords removed, no stemming); "
                   "words_in_document: every one appears in its relevant documents (together); other: the "
                   "rest, queries with no word left included; both over the queries with a relevant document")


def default_heldout_dir() -> Path:
    return store.cache_dir() / "heldout"


def task_dirs(names: list[str], root: Path, progress: Callable[[str], None] = print) -> dict[str, Path]:
    """Each task's directory under `root`, building those not there yet (in one audit pass)."""
    missing = [n for n in names if not (root / n / SOURCES_FILE).is_file()]
    if missing:
        progress(f"heldout: {', '.join(missing)} not built in {root}: building")
        build_heldout_tasks([heldout_source(n) for n in missing], root, progress=progress)
    return {name: root / name for name in names}


def word_matched(task: Task, split: str) -> dict[str, bool]:
    """{query id: True when every word of the query appears in its relevant documents} for the
    queries of `split` with a relevant document (grade > 0), the queries the metrics average.
    Words are BM25's tokens (`bm25_tokenize`) of the query and of `Task.doc_text`; a query
    with no word left (stopwords only) is False: nothing of it can be matched."""
    relevant = {qid: sorted(d for d, grade in docs.items() if grade > 0) for qid, docs in task.qrels[split].items()}
    relevant = {qid: docs for qid, docs in sorted(relevant.items()) if docs}
    doc_ids = sorted({d for docs in relevant.values() for d in docs})
    doc_words = dict(zip(doc_ids, map(set, bm25_tokenize([task.doc_text(d) for d in doc_ids]))))
    query_words = bm25_tokenize([task.queries[qid] for qid in relevant])
    return {
        qid: bool(words) and set(words) <= set().union(*(doc_words[d] for d in relevant[qid]))
        for qid, words in zip(relevant, query_words)
    }


def group_means(per_query: dict[str, float], groups: dict[str, Iterable[str]]) -> dict[str, float | None]:
    """{group: mean of `per_query` over the group's query ids (`math.fsum`), None when empty}."""
    means: dict[str, float | None] = {}
    for name, ids in groups.items():
        values = [per_query[qid] for qid in ids]
        means[name] = math.fsum(values) / len(values) if values else None
    return means


def word_groups(task: Task, split: str) -> dict[str, list[str]]:
    """`WORD_GROUPS` -> their query ids (`word_matched`)."""
    matched = word_matched(task, split)
    in_document, other = WORD_GROUPS
    return {in_document: [q for q, m in matched.items() if m], other: [q for q, m in matched.items() if not m]}


def _scored(metrics: dict, groups: dict[str, list[str]]) -> dict[str, float | None]:
    """A scorer's `SCORE_KEYS` and its `GROUP_METRIC` over each word group."""
    parts = group_means(metrics["per_query"][GROUP_METRIC], groups)
    return {**{k: metrics[k] for k in SCORE_KEYS}, **{f"{GROUP_METRIC}/{name}": parts[name] for name in groups}}


def score_tasks(encoder: str | None, names: list[str], root: Path, baselines: list[str], index: str = "flat",
                progress: Callable[[str], None] = print) -> dict:
    """{task: {queries, documents, source, task_hash, directory, scores: {encoder label: metrics}}}:
    nDCG@10 and recall@100 on split `SPLIT` of the encoder (a checkpoint or release directory;
    None: baselines only) and each baseline, on every task named (built under `root` first if
    it is not there). Each scorer also has `GROUP_METRIC` over each of `word_groups`'s groups
    ("ndcg@10/words_in_document", "ndcg@10/other"; None for an empty group), and each task
    the groups' sizes under "word_groups" with `WORD_MATCH_RULE`."""
    results = {}
    for name, task_dir in task_dirs(names, root, progress).items():
        task = load_task(task_dir)
        groups = word_groups(task, SPLIT)
        scores = {}
        if encoder is not None:
            progress(f"heldout: {name}: scoring {encoder}")
            metrics = evaluate_checkpoint(encoder, task, SPLIT, index=index)
            scores[encoder] = {**_scored(metrics, groups), "checkpoint_hash": metrics["checkpoint_hash"]}
        for baseline in baselines:
            progress(f"heldout: {name}: scoring {baseline}")
            scores[baseline] = _scored(evaluate_baseline(baseline, task, SPLIT), groups)
        results[name] = {
            "queries": len(task.split_queries(SPLIT)), "documents": len(task.corpus),
            "source": read_provenance(task_dir)["summary"], "task_hash": task.hash, "directory": str(task_dir),
            "word_groups": {**{group: len(ids) for group, ids in groups.items()}, "rule": WORD_MATCH_RULE},
            "scores": scores,
        }
    return results


def format_scores(results: dict) -> str:
    """One table per task of `score_tasks`'s results: its sizes, its source, a row per encoder,
    nDCG@10 over each word group beside the whole split's."""
    blocks = []
    for name, result in results.items():
        width = max([len("encoder"), *(len(label) for label in result["scores"])])
        sizes = result["word_groups"]
        heads = [f"{group} ({sizes[group]})" for group in WORD_GROUPS]
        lines = [
            f"{name}: {result['queries']} queries, {result['documents']} documents (split {SPLIT})",
            f"source: {result['source']}",
            "nDCG@10 by query: words_in_document, every word of the query (BM25's tokens) in its relevant "
            "documents; other, the rest",
            f"{'encoder':<{width}}  {'nDCG@10':>8}  {'recall@100':>10}  " + "  ".join(heads),
        ]
        for label, m in result["scores"].items():
            parts = [_cell(m[f"{GROUP_METRIC}/{group}"], len(head)) for group, head in zip(WORD_GROUPS, heads)]
            lines.append(f"{label:<{width}}  {m['ndcg@10']:>8.4f}  {m['recall@100']:>10.4f}  " + "  ".join(parts))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _cell(value: float | None, width: int) -> str:
    return f"{'–' if value is None else f'{value:.4f}':>{width}}"
