"""Built-in retrieval tasks made from real text in the built-in corpus.

`python-docstrings`: the standard library's docstrings. The query is a docstring's summary
(its first paragraph); the relevant document is the rest of the same docstring, titled with
the object's qualified name. Only documents of the corpus's recipe-dev and final-eval
splits are used, so no task document or query was ever training, tokenizer or mining text:
dev qrels come from dev-split docstrings, test qrels from test-split ones, and the task's
corpus holds both (each split's documents are unlabelled distractors for the other).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from embedlab.data.corpus import Corpus
from embedlab.evaluate.beir import Task, write_task

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


def build_builtin_task(name: str, corpus: Corpus, directory: Path) -> Task:
    """Build the named task from `corpus` and write it to `directory` in BEIR format."""
    if name != "python-docstrings":
        raise ValueError(f"unknown built-in task {name!r}; valid: {list(BUILTIN_TASKS)}")
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
        raise ValueError(f"task {name}: the corpus gave no dev or no test queries")
    task = Task(name=name, corpus=documents, queries=queries, qrels=qrels)
    write_task(task, directory)
    return task
