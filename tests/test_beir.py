"""embedlab.core.beir: BEIR task directories round-trip, hash stably and fail clearly."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from embedlab.core.beir import Task, TaskFormatError, load_task, task_hash, write_task

# Pinned so that an accidental change to the canonical serialisation is noticed: every
# cached result keyed by a task hash would silently stop matching.
SAMPLE_HASH = "ee9ca1536eace4bdb3dd414cc6c5b379f9c978282131b704641006b313e785a2"


def _sample_task(name: str = "sample") -> Task:
    return Task(
        name=name,
        corpus={
            "d1": ("Paris", "Paris is the capital of France."),
            "d2": ("", "Untitled: naïve café text with unicode — ✓."),
            "d3": ("Tabs", "Text with a\ttab and a \"quote\"."),
        },
        queries={"q1": "capital of france", "q2": "unicode", "q3": "unjudged query"},
        qrels={
            "test": {"q1": {"d1": 2, "d3": 0}, "q2": {"d2": 1}},
            "train": {"q2": {"d1": 0, "d2": 1}},
        },
    )


def _written(tmp_path: Path) -> Path:
    root = tmp_path / "sample"
    write_task(_sample_task(), root)
    return root


def test_round_trip_preserves_task(tmp_path: Path) -> None:
    """write_task then load_task gives back an equal Task, hash included."""
    task = _sample_task()
    write_task(task, tmp_path / "sample")

    loaded = load_task(tmp_path / "sample")

    assert loaded == task
    assert loaded.hash == task.hash


def test_hash_is_pinned_and_independent_of_order_and_name() -> None:
    """The hash is a fixed value for fixed content, whatever the dict order or task name."""
    task = _sample_task()
    shuffled = Task(
        name="renamed",
        corpus=dict(reversed(task.corpus.items())),
        queries=dict(reversed(task.queries.items())),
        qrels={s: {q: dict(reversed(j.items())) for q, j in reversed(r.items())}
               for s, r in reversed(task.qrels.items())},
    )

    assert task.hash == SAMPLE_HASH
    assert shuffled.hash == task.hash
    assert task_hash(task.corpus, task.queries, task.qrels) == task.hash


def test_hash_changes_with_any_content() -> None:
    """Changing a text, a grade or the set of splits changes the hash."""
    task = _sample_task()
    edited_text = dataclasses.replace(task, queries={**task.queries, "q3": "changed"})
    edited_grade = dataclasses.replace(
        task, qrels={**task.qrels, "test": {**task.qrels["test"], "q2": {"d2": 2}}}
    )
    fewer_splits = dataclasses.replace(task, qrels={"test": task.qrels["test"]})

    hashes = {task.hash, edited_text.hash, edited_grade.hash, fewer_splits.hash}

    assert len(hashes) == 4


def test_hash_ignores_file_line_order(tmp_path: Path) -> None:
    """Reversing the lines of every file on disk leaves the loaded hash unchanged."""
    root = _written(tmp_path)
    for path in (root / "corpus.jsonl", root / "queries.jsonl"):
        path.write_text("".join(reversed(path.read_text().splitlines(keepends=True))))
    qrels = root / "qrels" / "test.tsv"
    header, *rows = qrels.read_text().splitlines(keepends=True)
    qrels.write_text(header + "".join(reversed(rows)))

    assert load_task(root).hash == _sample_task().hash


def test_doc_text_joins_title_and_text() -> None:
    """doc_text is "title. text", or the text alone when the title is empty."""
    task = _sample_task()

    assert task.doc_text("d1") == "Paris. Paris is the capital of France."
    assert task.doc_text("d2") == "Untitled: naïve café text with unicode — ✓."


def test_split_queries_returns_only_judged_queries() -> None:
    """split_queries gives the queries with qrels in that split, and rejects unknown splits."""
    task = _sample_task()

    assert task.split_queries("test") == {"q1": "capital of france", "q2": "unicode"}
    assert task.split_queries("train") == {"q2": "unicode"}
    with pytest.raises(KeyError, match="no split 'dev'"):
        task.split_queries("dev")


def test_load_selected_splits(tmp_path: Path) -> None:
    """splits= restricts which qrels files are read; the default reads all of them."""
    root = _written(tmp_path)

    assert set(load_task(root).qrels) == {"test", "train"}
    assert set(load_task(root, splits=["test"]).qrels) == {"test"}


def test_missing_or_null_title_reads_as_empty(tmp_path: Path) -> None:
    """A corpus line without "title", or with "title": null, loads with an empty title."""
    root = _written(tmp_path)
    _set_line(root / "corpus.jsonl", 1, {"_id": "d1", "text": "no title"})
    _set_line(root / "corpus.jsonl", 2, {"_id": "d2", "title": None, "text": "null title"})

    corpus = load_task(root).corpus

    assert corpus["d1"] == ("", "no title")
    assert corpus["d2"] == ("", "null title")


def test_write_refuses_non_empty_directory(tmp_path: Path) -> None:
    """write_task will not write over an existing task, whose stale splits would load back."""
    root = _written(tmp_path)

    with pytest.raises(FileExistsError, match="not an empty directory"):
        write_task(_sample_task(), root)


def test_write_rejects_ids_that_break_tsv(tmp_path: Path) -> None:
    """A qrels id containing a tab cannot be written as TSV and is rejected by name."""
    task = _sample_task()
    bad = dataclasses.replace(
        task,
        corpus={**task.corpus, "d\t4": ("", "x")},
        qrels={"test": {"q1": {"d\t4": 1}}},
    )

    with pytest.raises(TaskFormatError, match=r"id 'd\\t4' contains a tab"):
        write_task(bad, tmp_path / "bad")


# --- error cases: each corrupts one file of a valid task --------------------------------


def _set_line(path: Path, number: int, content: dict[str, object] | str) -> None:
    """Replace 1-based line `number` of `path` (JSON-encoding dicts)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[number - 1] = content if isinstance(content, str) else json.dumps(content)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _append_line(path: Path, content: dict[str, object] | str) -> None:
    text = content if isinstance(content, str) else json.dumps(content)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text + "\n")


Corruption = Callable[[Path], None]
ERROR_CASES: list[tuple[str, Corruption, str, str]] = [
    # (case id, corruption applied to the task root, file named, rest of the message)
    ("missing corpus", lambda r: (r / "corpus.jsonl").unlink(), "corpus.jsonl", ": file not found"),
    ("missing queries", lambda r: (r / "queries.jsonl").unlink(),
     "queries.jsonl", ": file not found"),
    ("missing test split", lambda r: (r / "qrels" / "test.tsv").unlink(), "qrels/test.tsv",
     ": file not found (every task needs a test split)"),
    ("malformed json", lambda r: _set_line(r / "corpus.jsonl", 2, '{"_id": "d2", "text": '),
     "corpus.jsonl", ":2: malformed JSON"),
    ("not an object", lambda r: _set_line(r / "queries.jsonl", 3, '["q3"]'),
     "queries.jsonl", ":3: expected a JSON object"),
    ("missing _id", lambda r: _set_line(r / "queries.jsonl", 2, {"text": "no id"}),
     "queries.jsonl", ":2: missing field '_id'"),
    ("missing text", lambda r: _set_line(r / "corpus.jsonl", 3, {"_id": "d3", "title": "t"}),
     "corpus.jsonl", ":3: missing field 'text'"),
    ("non-string text", lambda r: _set_line(r / "queries.jsonl", 1, {"_id": "q1", "text": 7}),
     "queries.jsonl", ":1: field 'text' must be a string, got 7"),
    ("duplicate doc id", lambda r: _append_line(r / "corpus.jsonl", {"_id": "d2", "text": "again"}),
     "corpus.jsonl", ":4: duplicate _id 'd2' (first on line 2)"),
    ("duplicate query id", lambda r: _append_line(r / "queries.jsonl", {"_id": "q1", "text": "x"}),
     "queries.jsonl", ":4: duplicate _id 'q1' (first on line 1)"),
    ("empty corpus", lambda r: (r / "corpus.jsonl").write_text("\n"),
     "corpus.jsonl", ": corpus is empty"),
    ("not utf-8", lambda r: (r / "queries.jsonl").write_bytes(b'{"_id": "q1", "text": "\xff"}\n'),
     "queries.jsonl", ":1: not valid UTF-8"),
    ("bad header", lambda r: _set_line(r / "qrels" / "test.tsv", 1, "qid\tdocid\tscore"),
     "qrels/test.tsv", ":1: header must be"),
    ("unknown query id", lambda r: _append_line(r / "qrels" / "test.tsv", "q9\td1\t1"),
     "qrels/test.tsv", ":5: query-id 'q9' is not in queries.jsonl"),
    ("unknown corpus id", lambda r: _append_line(r / "qrels" / "test.tsv", "q1\td9\t1"),
     "qrels/test.tsv", ":5: corpus-id 'd9' is not in corpus.jsonl"),
    ("non-integer score", lambda r: _set_line(r / "qrels" / "train.tsv", 2, "q2\td1\t0.5"),
     "qrels/train.tsv", ":2: score '0.5' for ('q2', 'd1') is not an integer"),
    ("wrong field count", lambda r: _append_line(r / "qrels" / "test.tsv", "q1\td1"),
     "qrels/test.tsv", ":5: expected 3 tab-separated fields, got 2"),
    ("duplicate judgement", lambda r: _append_line(r / "qrels" / "test.tsv", "q1\td1\t0"),
     "qrels/test.tsv", ":5: duplicate judgement for ('q1', 'd1')"),
    ("header-only split",
     lambda r: (r / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n"),
     "qrels/train.tsv", ": no judgements"),
]


@pytest.mark.parametrize(
    ("corrupt", "file_name", "message"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
def test_format_errors_name_file_and_line(
    tmp_path: Path, corrupt: Corruption, file_name: str, message: str
) -> None:
    """Each malformed input raises TaskFormatError naming the file, line and offending id."""
    root = _written(tmp_path)
    corrupt(root)

    with pytest.raises(TaskFormatError) as raised:
        load_task(root)

    assert str(raised.value).startswith(str(root / file_name) + message)


def test_requested_split_must_exist(tmp_path: Path) -> None:
    """Asking for a split with no qrels file names the missing file."""
    root = _written(tmp_path)

    with pytest.raises(TaskFormatError, match=r"qrels/dev\.tsv: file not found"):
        load_task(root, splits=["test", "dev"])


def test_missing_directory(tmp_path: Path) -> None:
    """Loading a directory that does not exist says so and names it."""
    with pytest.raises(TaskFormatError, match="nowhere: task directory not found"):
        load_task(tmp_path / "nowhere")


def test_without_documents_drops_the_queries_that_judge_them_relevant() -> None:
    """Dropping d1 removes q1 from test (d1 relevant at grade 2) but keeps q2 in train, which
    judges d1 at grade 0; the corpus keeps every document; an unknown id is refused."""
    from embedlab.core.beir import without_documents
    from embedlab.core.errors import UnknownKey

    task = _sample_task()
    reduced, dropped = without_documents(task, ["d1"])
    assert dropped == ["q1"]
    assert reduced.qrels == {"test": {"q2": {"d2": 1}}, "train": {"q2": {"d1": 0, "d2": 1}}}
    assert reduced.corpus == task.corpus and reduced.hash != task.hash
    assert without_documents(task, ["d3"]) == (task, [])  # judged, but not relevant
    with pytest.raises(UnknownKey, match="'d9'"):
        without_documents(task, ["d1", "d9"])


def test_scores_without_documents_are_the_other_queries_means() -> None:
    """Oracle: the metrics of the reduced task equal the mean, over the queries kept, of the
    full task's per-query values (the left-out documents still compete as distractors)."""
    import numpy as np

    from embedlab.core.beir import without_documents
    from embedlab.tasks.retrieval import evaluate_encoder

    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    corpus = {f"d{i}": ("", " ".join(words[j % 10] for j in range(i, i + 3))) for i in range(12)}
    queries = {f"q{i}": " ".join(words[j % 10] for j in range(i, i + 2)) for i in range(10)}
    qrels = {"test": {f"q{i}": {f"d{i}": 1, f"d{i + 2}": 1} for i in range(10)}}
    task = Task(name="toy", corpus=corpus, queries=queries, qrels=qrels)

    def encode(texts):  # bag of words, normalised: deterministic and imperfect
        vectors = np.array([[text.split().count(w) for w in words] for text in texts], dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    full = evaluate_encoder(encode, task, "test")
    reduced, dropped = without_documents(task, ["d4", "d9"])
    assert dropped == ["q2", "q4", "q7", "q9"]
    part = evaluate_encoder(encode, reduced, "test")
    kept = [q for q in sorted(queries) if q not in dropped]
    for metric in ("ndcg@10", "recall@100"):
        assert part[metric] == pytest.approx(np.mean([full["per_query"][metric][q] for q in kept]), abs=1e-12)
    assert part["queries"] == 6
