"""Read and write retrieval tasks in the BEIR directory format, with a content hash.

A task directory holds::

    corpus.jsonl        one {"_id": str, "title": str, "text": str} object per line
                        ("title" may be absent or null: it is read as "")
    queries.jsonl       one {"_id": str, "text": str} object per line
    qrels/<split>.tsv   header "query-id<TAB>corpus-id<TAB>score", then one judgement per
                        line with an integer grade in 0..20 (at least one above 0); qrels/test.tsv is required

Blank lines in the JSONL files are skipped and other fields are ignored. Everything else
that is malformed raises `TaskFormatError`, whose message starts with ``<file>:<line>:``
(or ``<file>:`` for whole-file problems) and names the offending field or id, so a bad
download is found at load time rather than as a puzzling metric later.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from embedlab.core import paths
from embedlab.core.errors import UnknownKey, UserError, quoted

CORPUS_FILE = "corpus.jsonl"
QUERIES_FILE = "queries.jsonl"
QRELS_DIR = "qrels"
REQUIRED_SPLIT = "test"
QRELS_HEADER = ("query-id", "corpus-id", "score")
_HEADER_LINE = "\t".join(QRELS_HEADER)
# Stricter than int(), which also accepts "1_0" and surrounding spaces.
_INTEGER = re.compile(r"[+-]?[0-9]+")

Qrels = dict[str, dict[str, int]]


# Grades a qrels line may hold: 0 is not relevant; nDCG's gain 2^grade - 1 stays exact in
# float64 far beyond 20, and no retrieval set grades that finely.
MIN_GRADE, MAX_GRADE = 0, 20


class TaskFormatError(UserError, ValueError):
    """A task directory or its contents do not follow the BEIR format."""


@dataclass(frozen=True)
class Task:
    """One retrieval task, held in memory; treat its dictionaries as read-only.

    `corpus` maps doc id -> (title, text), `queries` maps query id -> text and `qrels` maps
    split -> query id -> doc id -> grade. `hash` is not passed in: it is always computed
    from the content by `task_hash`, so it can never go stale (`dataclasses.replace`
    recomputes it). `name` is not part of the hash: renaming a directory changes nothing.
    """

    name: str
    corpus: dict[str, tuple[str, str]] = field(repr=False)
    queries: dict[str, str] = field(repr=False)
    qrels: dict[str, Qrels] = field(repr=False)
    hash: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hash", task_hash(self.corpus, self.queries, self.qrels))

    def doc_text(self, doc_id: str) -> str:
        """The text to embed for a document: "title. text", or just text if the title is blank.

        A blank title is empty or whitespace only. The ". " makes the title read as its own
        sentence; BEIR's reference encoders join with a plain space, so scores can differ
        slightly from published BEIR numbers.
        """
        title, text = self.corpus[doc_id]
        return f"{title}. {text}" if title.strip() else text

    def split_queries(self, split: str) -> dict[str, str]:
        """Query id -> text for the queries judged in `split`, ordered by query id."""
        if split not in self.qrels:
            raise UnknownKey(f"task {self.name!r} has no split {split!r}, only {sorted(self.qrels)}")
        return {qid: self.queries[qid] for qid in sorted(self.qrels[split])}


def without_documents(task: Task, doc_ids: Iterable[str]) -> tuple[Task, list[str]]:
    """`task` without the queries that judge any of `doc_ids` relevant (grade > 0), in every
    split, and the ids of the queries dropped. The documents stay in the corpus as
    distractors, so every other query is ranked against exactly the same documents.

    This is how a score is reported without a contaminated item: a document the audit found
    in the training data cannot fairly be retrieved, so its queries are left out (for every
    encoder compared, so the comparison stays paired). An id not in the corpus is an
    UnknownKey: a typo must not silently leave the score unchanged."""
    wanted = set(doc_ids)
    unknown = sorted(wanted - set(task.corpus))
    if unknown:
        raise UnknownKey(f"task {task.name!r}: no document {', '.join(map(repr, unknown))} in its corpus")
    dropped = sorted({qid for judged in task.qrels.values() for qid, grades in judged.items()
                      if any(grades.get(doc, 0) > 0 for doc in wanted)})
    gone = set(dropped)
    qrels = {split: {qid: grades for qid, grades in judged.items() if qid not in gone}
             for split, judged in task.qrels.items()}
    return replace(task, qrels=qrels), dropped


def task_hash(
    corpus: dict[str, tuple[str, str]], queries: dict[str, str], qrels: dict[str, Qrels]
) -> str:
    """sha256 hex digest of a canonical serialisation of the content.

    Records are visited in sorted id order, each as one compact JSON array per line, so the
    digest depends only on the content, not on file or dictionary order. It covers exactly
    the splits present in `qrels`: loading a subset of splits gives a different hash.
    """
    digest = hashlib.sha256()

    def add(record: list[object]) -> None:
        digest.update(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode())
        digest.update(b"\n")

    for doc_id in sorted(corpus):
        add(["corpus", doc_id, *corpus[doc_id]])
    for qid in sorted(queries):
        add(["query", qid, queries[qid]])
    for split in sorted(qrels):
        for qid in sorted(qrels[split]):
            for doc_id in sorted(qrels[split][qid]):
                add(["qrel", split, qid, doc_id, qrels[split][qid][doc_id]])
    return digest.hexdigest()


def load_task(path: str | Path, splits: list[str] | None = None) -> Task:
    """Load and validate the task in directory `path`, named after the directory.

    `splits` selects which qrels/<split>.tsv files to read (default: all present).
    qrels/test.tsv must exist whichever splits are read. Raises TaskFormatError.
    """
    root = Path(path)
    found = paths.kind(root)
    if found != "a directory":
        raise TaskFormatError(f"{root}: task directory not found" if found is None else
                              f"{root}: {found}, not a task directory (corpus.jsonl, queries.jsonl, qrels/)")
    corpus = read_corpus(root / CORPUS_FILE)
    queries = read_queries(root / QUERIES_FILE)
    qrels = {
        split: read_qrels(_qrels_path(root, split), queries, corpus)
        for split in _select_splits(root, splits)
    }
    return Task(name=root.name, corpus=corpus, queries=queries, qrels=qrels)


def write_task(task: Task, path: str | Path) -> None:
    """Write `task` as a BEIR directory at `path`, records sorted by id.

    `path` must not exist or be an empty directory: a leftover qrels file from an earlier
    task would otherwise be loaded back as one of this task's splits.
    """
    root = Path(path)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root}: exists and is not an empty directory")
    _check_tsv_safe(task)
    (root / QRELS_DIR).mkdir(parents=True, exist_ok=True)
    _write_jsonl(
        root / CORPUS_FILE,
        ({"_id": doc_id, "title": title, "text": text}
         for doc_id, (title, text) in sorted(task.corpus.items())),
    )
    _write_jsonl(
        root / QUERIES_FILE,
        ({"_id": qid, "text": text} for qid, text in sorted(task.queries.items())),
    )
    for split, qrels in task.qrels.items():
        _write_qrels(_qrels_path(root, split), qrels)


# --- loading ---------------------------------------------------------------------------


def _qrels_path(root: Path, split: str) -> Path:
    return root / QRELS_DIR / f"{split}.tsv"


def _select_splits(root: Path, splits: list[str] | None) -> list[str]:
    required = _qrels_path(root, REQUIRED_SPLIT)
    if not required.is_file():
        raise TaskFormatError(f"{required}: file not found (every task needs a test split)")
    if splits is None:
        return sorted(p.stem for p in (root / QRELS_DIR).glob("*.tsv"))
    for split in splits:
        if not _qrels_path(root, split).is_file():
            raise TaskFormatError(f"{_qrels_path(root, split)}: file not found")
    return list(splits)


def _read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line without its line ending) for each line."""
    if not path.is_file():
        raise TaskFormatError(f"{path}: file not found")
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                raise TaskFormatError(f"{path}:{number}: not valid UTF-8 ({error})") from None


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    for number, line in _read_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskFormatError(f"{path}:{number}: malformed JSON ({error})") from None
        if not isinstance(record, dict):
            raise TaskFormatError(f"{path}:{number}: expected a JSON object")
        yield number, record


def _string_field(path: Path, number: int, record: dict[str, object], name: str) -> str:
    if name not in record:
        raise TaskFormatError(f"{path}:{number}: missing field {name!r}")
    value = record[name]
    if not isinstance(value, str):
        shown = repr(value) if value is None or isinstance(value, bool | int | float) else type(value).__name__
        raise TaskFormatError(f"{path}:{number}: field {name!r} must be a string, got {shown}")
    return value


def _record_id(path: Path, number: int, record: dict[str, object], seen: dict[str, int]) -> str:
    """The record's `_id`, after checking it is a non-empty string not seen on an earlier line."""
    record_id = _string_field(path, number, record, "_id")
    if not record_id:
        raise TaskFormatError(f"{path}:{number}: field '_id' is empty")
    if record_id in seen:
        raise TaskFormatError(
            f"{path}:{number}: duplicate _id {record_id!r} (first on line {seen[record_id]})"
        )
    seen[record_id] = number
    return record_id


def read_corpus(path: Path) -> dict[str, tuple[str, str]]:
    """A BEIR corpus.jsonl as {doc id: (title, text)}; TaskFormatError naming the line otherwise."""
    corpus: dict[str, tuple[str, str]] = {}
    seen: dict[str, int] = {}
    for number, record in _read_jsonl(path):
        doc_id = _record_id(path, number, record, seen)
        if record.get("title") is None:  # BEIR corpora without titles omit it or write null
            title = ""
        else:
            title = _string_field(path, number, record, "title")
        corpus[doc_id] = (title, _string_field(path, number, record, "text"))
    if not corpus:
        raise TaskFormatError(f"{path}: corpus is empty")
    return corpus


def read_queries(path: Path) -> dict[str, str]:
    """A BEIR queries.jsonl as {query id: text}; TaskFormatError naming the line otherwise."""
    queries: dict[str, str] = {}
    seen: dict[str, int] = {}
    for number, record in _read_jsonl(path):
        qid = _record_id(path, number, record, seen)
        queries[qid] = _string_field(path, number, record, "text")
    if not queries:
        raise TaskFormatError(f"{path}: no queries")
    return queries


def read_qrels(
    path: Path, queries: dict[str, str], corpus: dict[str, tuple[str, str]]
) -> Qrels:
    """A BEIR qrels/<split>.tsv whose ids all name `queries` and `corpus`; TaskFormatError naming
    the line otherwise."""
    lines = _read_lines(path)
    header = next(lines, (1, ""))[1]
    if header != _HEADER_LINE:
        raise TaskFormatError(f"{path}:1: header must be {_HEADER_LINE!r}")
    qrels: Qrels = {}
    for number, line in lines:
        if not line.strip():
            continue
        qid, doc_id, grade = _parse_qrel(path, number, line, queries, corpus)
        judgements = qrels.setdefault(qid, {})
        if doc_id in judgements:
            raise TaskFormatError(
                f"{path}:{number}: duplicate judgement for ({quoted(qid)}, {quoted(doc_id)})"
            )
        judgements[doc_id] = grade
    if not qrels:
        raise TaskFormatError(f"{path}: no judgements")
    if not any(grade > 0 for judged in qrels.values() for grade in judged.values()):
        raise TaskFormatError(f"{path}: every grade is 0, so no query has a relevant document to retrieve")
    return qrels


def _parse_qrel(
    path: Path,
    number: int,
    line: str,
    queries: dict[str, str],
    corpus: dict[str, tuple[str, str]],
) -> tuple[str, str, int]:
    fields = line.split("\t")
    if len(fields) != len(QRELS_HEADER):
        raise TaskFormatError(
            f"{path}:{number}: expected 3 tab-separated fields, got {len(fields)}"
        )
    qid, doc_id, score = fields
    if qid not in queries:
        raise TaskFormatError(f"{path}:{number}: query-id {quoted(qid)} is not in {QUERIES_FILE}")
    if doc_id not in corpus:
        raise TaskFormatError(f"{path}:{number}: corpus-id {quoted(doc_id)} is not in {CORPUS_FILE}")
    if not _INTEGER.fullmatch(score):
        raise TaskFormatError(
            f"{path}:{number}: score {quoted(score)} for ({quoted(qid)}, {quoted(doc_id)}) is not an integer"
        )
    grade = int(score)
    if not MIN_GRADE <= grade <= MAX_GRADE:
        raise TaskFormatError(
            f"{path}:{number}: grade {score} for ({quoted(qid)}, {quoted(doc_id)}) is outside {MIN_GRADE}..{MAX_GRADE} "
            "(0 not relevant, higher more relevant; write a negative 'junk' grade as 0)"
        )
    return qid, doc_id, grade


# --- writing ---------------------------------------------------------------------------


def _check_tsv_safe(task: Task) -> None:
    """Reject split names and qrels ids that would corrupt a file name or a TSV row."""
    for split, qrels in task.qrels.items():
        if not split or any(c in split for c in "/\\\t\r\n") or split.startswith("."):
            raise TaskFormatError(f"task {task.name!r}: split name {split!r} is not a file name")
        for qid, judgements in qrels.items():
            for item_id in (qid, *judgements):
                if any(c in item_id for c in "\t\r\n"):
                    raise TaskFormatError(
                        f"task {task.name!r}, split {split!r}: id {item_id!r} "
                        "contains a tab or newline"
                    )


def _write_jsonl(path: Path, records: Iterable[dict[str, str]]) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def _write_qrels(path: Path, qrels: Qrels) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        handle.write("\t".join(QRELS_HEADER) + "\n")
        for qid in sorted(qrels):
            for doc_id, grade in sorted(qrels[qid].items()):
                handle.write(f"{qid}\t{doc_id}\t{grade}\n")
