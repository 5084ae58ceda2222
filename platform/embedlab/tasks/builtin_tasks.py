"""Built-in retrieval tasks made from real text in the built-in corpus.

`python-docstrings`: the standard library's docstrings. The query is a docstring's summary
(its first paragraph); the relevant document is the rest of the same docstring, titled with
the object's qualified name. Only documents of the corpus's recipe-dev and final-eval
splits are used, so no task document or query was ever training, tokenizer or mining text:
dev qrels come from dev-split docstrings, test qrels from test-split ones, and the task's
corpus holds both (each split's documents are unlabelled distractors for the other).

Splitting by near-duplicate group is not enough on its own: boilerplate paragraphs and
docstrings inherited by several classes put a task's text *inside* longer training
documents. `decontaminate` therefore removes every query and labelled document that the
contamination audit finds (exact, contained or near) in any training-split document,
and the removals are recorded with the task (`decontamination.json`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from embedlab.contamination.audit import Finding, MATCH_KINDS
from embedlab.core.beir import Task
from embedlab.core.errors import UsageError
from embedlab.sources.corpus import Corpus

BUILTIN_TASKS = ("python-docstrings",)
MIN_SUMMARY_WORDS = 3
MIN_BODY_CHARACTERS = 80


def split_docstring(text: str) -> tuple[str, str] | None:
    """(summary, body) of a cleaned docstring, or None when either part is too thin."""
    summary, _, body = text.strip().partition("\n\n")
    summary, body = " ".join(summary.split()), body.strip()
    if len(summary.split()) < MIN_SUMMARY_WORDS or len(body) < MIN_BODY_CHARACTERS:
        return None
    return summary, body


def decontaminate(task: Task, findings: Iterable[Finding]) -> tuple[Task, dict]:
    """`task` without the queries and labelled documents the audit found in training text.

    A removed document takes its queries with it (they would have no relevant document).
    """
    findings = list(findings)
    bad_docs = {f.item_id for f in findings if f.item_kind == "document"}
    bad_queries = {f.item_id for f in findings if f.item_kind == "query"}
    qrels: dict[str, dict[str, dict[str, int]]] = {}
    for split, judged in task.qrels.items():
        qrels[split] = {
            qid: rel for qid, rel in judged.items() if qid not in bad_queries and not set(rel) & bad_docs
        }
    kept_queries = {qid for judged in qrels.values() for qid in judged}
    cleaned = Task(
        name=task.name,
        corpus={d: v for d, v in task.corpus.items() if d not in bad_docs},
        queries={q: v for q, v in task.queries.items() if q in kept_queries},
        qrels=qrels,
    )
    summary = {
        "rule": f"remove queries and labelled documents found ({', '.join(MATCH_KINDS)}) in training-split text",
        "documents_removed": sorted(bad_docs),
        "queries_removed": sorted(set(task.queries) - kept_queries),
        "queries_kept": {split: len(judged) for split, judged in qrels.items()},
    }
    return cleaned, summary


def build_builtin_task(name: str, corpus: Corpus) -> Task:
    """The named task built from `corpus` (dev and test split documents only)."""
    if name != "python-docstrings":
        raise UsageError(f"unknown built-in task {name!r}; valid: {list(BUILTIN_TASKS)}")
    table = corpus.read(sources=["python-docstrings"]).to_pydict()
    documents: dict[str, tuple[str, str]] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, dict[str, int]]] = {"dev": {}, "test": {}}
    candidates: list[tuple[str, str, str]] = []
    for doc_id, title, text, split in zip(table["doc_id"], table["title"], table["text"], table["split"]):
        if split not in qrels:
            continue
        parts = split_docstring(text)
        if parts is None:
            continue
        summary, body = parts
        documents[doc_id] = (title, body)
        candidates.append((doc_id, summary, split))
    # A summary shared by two docstrings would make a query with an arbitrary answer: such
    # documents stay in the corpus as distractors, but neither becomes a query.
    summary_counts = Counter(summary.lower() for _, summary, _ in candidates)
    for doc_id, summary, split in candidates:
        if summary_counts[summary.lower()] == 1:
            query_id = f"q:{doc_id}"
            queries[query_id] = summary
            qrels[split][query_id] = {doc_id: 1}
    if not qrels["dev"] or not qrels["test"]:
        raise UsageError(f"task {name}: the corpus gave no dev or no test queries")
    return Task(name=name, corpus=documents, queries=queries, qrels=qrels)
