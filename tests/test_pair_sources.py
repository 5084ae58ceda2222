"""User pair sources: jsonl/parquet/csv files, Hub-layout datasets and BEIR training folders,
on real English text (the standard library's docstrings), without network."""

from __future__ import annotations

import collections
import csv
import dataclasses
import glob
import hashlib
import heapq
import inspect
import json
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedlab.core.config import DataConfig
from embedlab.sources.corpus import split_of
from embedlab.sources.external import SourceError
from embedlab.pairs.readers import (
    USER_PAIR_SCHEMA,
    BEIRPairs,
    HFPairs,
    PairFiles,
    PairReadStats,
    UserPair,
    beir_doc_text,
    group_pairs,
    pair_source_provenance,
    read_pairs,
    split_pairs,
    user_pair_rows,
    user_pairs_to_table,
)
from embedlab.core.beir import load_task
from embedlab.pairs.builders import PAIR_SCHEMA, Pair, pairs_to_table

RIGHTS = "Python Software Foundation License 2.0 (docstrings of the standard library)"
FUNCTIONS = (json.dumps, shutil.copytree, shutil.rmtree, textwrap.wrap, textwrap.dedent, subprocess.run, glob.glob,
             heapq.merge, collections.namedtuple, textwrap.fill)


def summary_and_body(function) -> tuple[str, str]:
    """A docstring's first paragraph, whitespace collapsed (a query) and the rest (its positive)."""
    summary, _, body = inspect.getdoc(function).partition("\n\n")
    return " ".join(summary.split()), body.strip()


def longest_paragraph(function) -> str:
    return " ".join(max(inspect.getdoc(function).split("\n\n"), key=len).split())


@pytest.fixture(scope="module")
def docs() -> list[tuple[str, str]]:
    return [summary_and_body(f) for f in FUNCTIONS]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    """A CSV file with a header; a list cell is written as a JSON array."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()} for row in rows)
    return path


WRITERS = {".jsonl": write_jsonl, ".parquet": write_parquet, ".csv": write_csv}


def csv_start_lines(rows: list[dict]) -> list[int]:
    """The editor line each CSV record starts on: the header is line 1, a cell's newlines add lines."""
    lines, line = [], 2
    for row in rows:
        lines.append(line)
        line += 1 + sum(str(v).count("\n") for v in row.values())
    return lines


def content(pairs: list[UserPair]) -> list[tuple]:
    return [(p.query, p.positives, p.negatives, p.scores) for p in pairs]


# ---------------------------------------------------------------------------------------------
# Column conventions and formats


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_every_column_convention_loads_the_same_pairs(tmp_path, docs, suffix):
    """anchor/positive/negative_n, query/positive/negatives list and an explicit mapping give the same
    pairs in every format; one negative column and negative-free conventions give their part of them."""
    triples = [(docs[i][0], docs[i][1], [docs[i + 3][1], docs[i + 6][1]]) for i in range(3)]
    expected = [(q, (p,), tuple(n), (None,)) for q, p, n in triples]
    layouts = {
        "anchor-positive-negative_n": ([{"anchor": q, "positive": p, "negative_1": n[0], "negative_2": n[1]}
                                        for q, p, n in triples], {}),
        "query-positive-negatives": ([{"query": q, "positive": p, "negatives": n} for q, p, n in triples], {}),
        "explicit": ([{"title": q, "body": p, "wrong_a": n[0], "wrong_b": n[1]} for q, p, n in triples],
                     dict(query_field="title", positive_field="body", negative_fields=("wrong_a", "wrong_b"))),
    }
    partial = {
        "anchor-positive-negative": ([{"anchor": q, "positive": p, "negative": n[0]} for q, p, n in triples],
                                     [(q, p, n[:1], s) for q, p, n, s in expected]),
        "sentence1-sentence2": ([{"sentence1": q, "sentence2": p} for q, p, _ in triples],
                                [(q, p, (), s) for q, p, _, s in expected]),
        "question-answer": ([{"question": q, "answer": p} for q, p, _ in triples],
                            [(q, p, (), s) for q, p, _, s in expected]),
    }
    for convention, (rows, mapping) in layouts.items():
        file = WRITERS[suffix](tmp_path / convention / f"pairs{suffix}", rows)
        stats = PairReadStats()
        pairs = read_pairs(PairFiles(name="conv", path=str(file), rights=RIGHTS, **mapping), stats=stats)
        assert content(pairs) == expected, convention
        assert stats.conventions == {f"pairs{suffix}": convention}
        assert (stats.records, stats.pairs, dict(stats.dropped), dict(stats.skipped)) == (3, 3, {}, {})
        locators = {".jsonl": [1, 2, 3], ".parquet": [0, 1, 2], ".csv": csv_start_lines(rows)}[suffix]
        assert [p.pair_id for p in pairs] == [f"conv:pairs{suffix}:{n}" for n in locators]
        assert [p.doc_ids for p in pairs] == [(p.pair_id,) for p in pairs]
    for convention, (rows, wanted) in partial.items():
        file = WRITERS[suffix](tmp_path / convention / f"pairs{suffix}", rows)
        stats = PairReadStats()
        assert content(read_pairs(PairFiles(name="conv", path=str(file), rights=RIGHTS), stats=stats)) == wanted
        assert stats.conventions == {f"pairs{suffix}": convention}


def test_directory_is_read_in_sorted_order_with_ids_from_the_id_column(tmp_path, docs):
    """A directory: files in sorted relative-path order, each with its own convention; an id column gives
    <name>:<id> (a repeat gets ~2); other files are listed as ignored."""
    write_jsonl(tmp_path / "b.jsonl", [{"id": "x", "anchor": docs[1][0], "positive": docs[1][1]}])
    write_csv(tmp_path / "a" / "z.csv", [{"id": "x", "question": docs[0][0], "answer": docs[0][1]}])
    write_parquet(tmp_path / "c.parquet", [{"query": docs[2][0], "positive": docs[2][1], "id": None}])
    (tmp_path / "README.txt").write_text("not pairs")
    stats = PairReadStats()
    pairs = read_pairs(PairFiles(name="dir", path=str(tmp_path), rights=RIGHTS), stats=stats)
    assert [(p.pair_id, p.locator, p.query) for p in pairs] == [
        ("dir:x", "a/z.csv:2", docs[0][0]),
        ("dir:x~2", "b.jsonl:1", docs[1][0]),
        ("dir:c.parquet:0", "c.parquet:0", docs[2][0]),
    ]
    assert stats.renamed_duplicate_ids == 1
    assert stats.ignored_files == ["README.txt"]
    assert stats.conventions == {"a/z.csv": "question-answer", "b.jsonl": "anchor-positive",
                                 "c.parquet": "query-positive"}


def test_score_and_label_at_or_below_zero_are_not_positive_pairs(tmp_path, docs):
    """A score/label <= 0 row is skipped and counted; kept rows carry their score; a label other than
    0/1 (multi-class, as NLI's) is an error naming file, line and column."""
    labelled = [{"sentence1": q, "sentence2": p, "label": label} for (q, p), label in zip(docs[:4], [1, 0, 1, 0])]
    stats = PairReadStats()
    pairs = read_pairs(PairFiles(name="cls", path=str(write_csv(tmp_path / "cls.csv", labelled)), rights=RIGHTS),
                       stats=stats)
    assert content(pairs) == [(docs[0][0], (docs[0][1],), (), (1.0,)), (docs[2][0], (docs[2][1],), (), (1.0,))]
    assert stats.conventions == {"cls.csv": "sentence1-sentence2+label"}
    lines = csv_start_lines(labelled)
    assert stats.skipped == {"label <= 0 (not a positive pair)": 2}
    assert stats.skipped_examples == {"label <= 0 (not a positive pair)": [f"cls.csv:{n}" for n in lines[1::2]]}

    scored = [{"anchor": q, "positive": p, "score": s} for (q, p), s in zip(docs[:3], [0.75, 0.0, -1.5])]
    stats = PairReadStats()
    pairs = read_pairs(PairFiles(name="s", path=str(write_parquet(tmp_path / "s.parquet", scored)), rights=RIGHTS),
                       stats=stats)
    assert [(p.pair_id, p.score) for p in pairs] == [("s:s.parquet:0", 0.75)]
    assert stats.skipped == {"score <= 0 (not a positive pair)": 2}

    nli = [{"sentence1": docs[0][0], "sentence2": docs[0][1], "label": 0},
           {"sentence1": docs[1][0], "sentence2": docs[1][1], "label": 2}]
    file = write_jsonl(tmp_path / "nli.jsonl", nli)
    with pytest.raises(SourceError,
                       match=rf"^{re.escape(str(file))} line 2: column 'label' is 2; a label must be 0 or 1"):
        read_pairs(PairFiles(name="nli", path=str(file), rights=RIGHTS))


# ---------------------------------------------------------------------------------------------
# Validation


def test_redundant_negatives_are_dropped_and_counted(tmp_path, docs):
    """Negatives equal (after whitespace and case folding) to the positive or the query, empty, null,
    absent or repeated are dropped and counted; so is a positive equal to its query, whose row is skipped."""
    (q0, p0), (q1, p1), (q2, p2) = docs[:3]
    rows = [
        {"anchor": q0, "positive": p0, "negative_1": "  " + p0.upper().replace(" ", "\n "), "negative_2": p1,
         "negative_3": q0.lower()},
        {"anchor": q1, "positive": p1, "negative_1": "", "negative_2": None, "negative_3": p2},
        {"anchor": q2, "positive": p2, "negative_1": p0, "negative_3": " ".join(p0.split())},
        {"anchor": q2, "positive": f" {q2.upper()} ", "negative_1": p0, "negative_2": p1, "negative_3": p1},
    ]
    file = write_jsonl(tmp_path / "negatives.jsonl", rows)
    stats = PairReadStats()
    pairs = read_pairs(PairFiles(name="n", path=str(file), rights=RIGHTS), stats=stats)
    assert content(pairs) == [(q0, (p0,), (p1,), (None,)), (q1, (p1,), (p2,), (None,)), (q2, (p2,), (p0,), (None,))]
    assert stats.dropped == {"negative equals positive": 1, "negative equals query": 1, "empty negative": 3,
                             "repeated negative": 1, "positive equals query": 1}
    assert stats.dropped_examples == {
        "negative equals positive": ["negatives.jsonl:1"], "negative equals query": ["negatives.jsonl:1"],
        "empty negative": ["negatives.jsonl:2", "negatives.jsonl:2", "negatives.jsonl:3"],
        "repeated negative": ["negatives.jsonl:3"], "positive equals query": ["negatives.jsonl:4"]}
    assert stats.skipped == {"no positive left": 1}
    assert (stats.records, stats.pairs) == (4, 3)


def test_bad_rows_name_file_row_and_column(tmp_path, docs):
    """A missing query/positive column, an empty or whitespace text and a non-string text raise
    SourceError naming the file, the line (JSONL, CSV) or row (Parquet) and the column."""
    good = {"anchor": docs[0][0], "positive": docs[0][1]}
    empty = {"anchor": docs[1][0], "positive": ""}
    cases = [
        (write_jsonl(tmp_path / "missing.jsonl", [good, {"anchor": docs[1][0], "negative": docs[2][1]}]),
         "line 2: missing column 'positive'; columns present: anchor, negative"),
        (write_parquet(tmp_path / "blank.parquet", [good, {"anchor": " \n\t", "positive": docs[1][1]}]),
         "row 1: column 'anchor' is empty"),
        (write_csv(tmp_path / "empty.csv", [good, empty]), f"line {csv_start_lines([good, empty])[1]}: "
                                                            "column 'positive' is empty"),
        (write_jsonl(tmp_path / "number.jsonl", [good, good, {"anchor": docs[1][0], "positive": 42}]),
         "line 3: column 'positive' is int, expected a string"),
        (write_jsonl(tmp_path / "list.jsonl", [{**good, "negatives": docs[1][1]}]),
         "line 1: column 'negatives' is str, expected a list of strings"),
    ]
    for file, message in cases:
        with pytest.raises(SourceError) as error:
            read_pairs(PairFiles(name="bad", path=str(file), rights=RIGHTS))
        assert str(error.value).startswith(f"{file} {message}"), str(error.value)
    file = write_jsonl(tmp_path / "unknown.jsonl", [{"title": docs[0][0], "text": docs[0][1]}])
    expected = (rf"^{re.escape(str(file))}: no pair columns among title, text; expected one of: "
                r"anchor \+ positive; query \+ positive; .*query_field and positive_field")
    with pytest.raises(SourceError, match=expected):
        read_pairs(PairFiles(name="bad", path=str(file), rights=RIGHTS))


@pytest.mark.parametrize("revision", ["", "  ", None])
def test_config_refuses_an_unpinned_dataset_and_a_missing_rights_note(revision):
    """HFPairs needs a revision and says why; every source needs a rights note; a partial mapping is refused."""
    with pytest.raises(SourceError, match=r"needs a revision .*could change between runs"):
        HFPairs(name="x", dataset="some/dataset", revision=revision, rights=RIGHTS)
    with pytest.raises(SourceError, match=r"'x': rights must state the licence"):
        PairFiles(name="x", path="p.jsonl", rights=revision)
    with pytest.raises(SourceError, match=r"set query_field and positive_field together"):
        PairFiles(name="x", path="p.jsonl", rights=RIGHTS, query_field="q")
    with pytest.raises(SourceError, match=r"need query_field and positive_field"):
        PairFiles(name="x", path="p.jsonl", rights=RIGHTS, score_field="s")


# ---------------------------------------------------------------------------------------------
# BEIR


def write_beir(root: Path, corpus: dict[str, tuple[str, str]], queries: dict[str, str],
               qrels: dict[str, list[tuple[str, str, int]]]) -> Path:
    write_jsonl(root / "corpus.jsonl", [{"_id": d, "title": t, "text": x} for d, (t, x) in corpus.items()])
    write_jsonl(root / "queries.jsonl", [{"_id": q, "text": x} for q, x in queries.items()])
    (root / "qrels").mkdir()
    for split, judgements in qrels.items():
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{g}\n" for q, d, g in judgements))
    return root


def test_beir_train_split_becomes_multi_positive_pairs_with_graded_scores(tmp_path, docs):
    """Each judged query is one pair: its documents graded > 0 as positives, best first, with their
    grades; text as the BEIR evaluator embeds it; queries sharing a relevant document share a group."""
    names = [f.__qualname__ for f in FUNCTIONS]
    corpus = {f"d{i}": (names[i] if i != 1 else "", docs[i][1]) for i in range(6)}
    queries = {f"q{i}": docs[i][0] for i in range(6)}
    train = [("q0", "d2", 2), ("q0", "d0", 1), ("q0", "d1", 2), ("q0", "d3", 0),
             ("q4", "d4", 3), ("q4", "d2", 1), ("q5", "d5", 0), ("q3", "d3", 1)]
    root = write_beir(tmp_path / "task", corpus, queries, {"train": train, "test": [("q1", "d1", 1)]})
    stats = PairReadStats()
    source = BEIRPairs(name="beir", path=str(root), rights=RIGHTS)
    pairs = read_pairs(source, stats=stats)
    task = load_task(root)
    text = {d: task.doc_text(d) for d in corpus}
    assert text["d0"] == f"{names[0]}. {docs[0][1]}" and text["d1"] == docs[1][1]
    assert [beir_doc_text(*corpus[d]) for d in corpus] == list(text.values())
    assert [(p.pair_id, p.locator, p.query, p.positives, p.scores, p.doc_ids, p.negatives) for p in pairs] == [
        ("beir:q0", "train:q0", docs[0][0], (text["d1"], text["d2"], text["d0"]), (2.0, 2.0, 1.0),
         ("beir:d1", "beir:d2", "beir:d0"), ()),
        ("beir:q3", "train:q3", docs[3][0], (text["d3"],), (1.0,), ("beir:d3",), ()),
        ("beir:q4", "train:q4", docs[4][0], (text["d4"], text["d2"]), (3.0, 1.0), ("beir:d4", "beir:d2"), ()),
    ]
    assert stats.skipped == {"no document graded > 0": 1}
    assert stats.skipped_examples == {"no document graded > 0": ["train:q5"]}
    assert stats.conventions == {"train": "beir-qrels"}
    (root / "qrels" / "test.tsv").unlink()  # a folder of training judgements needs no test split
    assert read_pairs(source) == pairs
    assert {p.pair_id: p.positive_group for p in group_pairs(pairs).pairs} == {
        "beir:q0": "beir:q0", "beir:q3": "beir:q3", "beir:q4": "beir:q0"}
    # Judged-irrelevant documents as negatives, when asked for.
    with_negatives = read_pairs(dataclasses.replace(source, zero_grade_negatives=True))
    assert [p.negatives for p in with_negatives] == [(text["d3"],), (), ()]
    provenance = pair_source_provenance(source)
    assert [(f["path"], f["rows"], f["sha256"]) for f in provenance["files"]] == [
        (name, rows, hashlib.sha256((root / name).read_bytes()).hexdigest())
        for name, rows in (("corpus.jsonl", 6), ("queries.jsonl", 6), ("qrels/train.tsv", 8))]
    assert (provenance["kind"], provenance["split"], provenance["rights"]) == ("beir-pairs", "train", RIGHTS)


# ---------------------------------------------------------------------------------------------
# Groups and splits


def test_near_duplicate_queries_share_a_group_and_never_straddle_splits(tmp_path, docs):
    """Near-duplicate queries, near-duplicate positives, case-folded equal positives and a query equal to
    another pair's positive join one group, named by its smallest id; exact duplicates are removed and
    counted; splits follow the group (the corpus's rule) whatever the seed."""
    walk, mkstemp = longest_paragraph(os.walk), longest_paragraph(tempfile.mkstemp)
    move, which, disk = (summary_and_body(f) for f in (shutil.move, shutil.which, shutil.disk_usage))
    rows = [{"id": f"doc{i}", "anchor": q, "positive": p} for i, (q, p) in enumerate(docs)]
    rows += [
        {"id": "walk-b", "anchor": walk, "positive": move[1]},
        {"id": "walk-a", "anchor": " ".join(walk.split()[:-3]), "positive": which[1]},  # 3 words shorter
        {"id": "tmp-1", "anchor": move[0], "positive": mkstemp},
        {"id": "tmp-2", "anchor": which[0], "positive": " ".join(mkstemp.split()[:-2])},
        {"id": "dup", "anchor": f"  {docs[0][0].upper()}  ", "positive": docs[0][1].replace(" ", "\n")},
        {"id": "case", "anchor": disk[0], "positive": docs[1][1].upper()},
        {"id": "cross", "anchor": docs[2][1], "positive": disk[1]},
    ]
    pairs = read_pairs(PairFiles(name="user", path=str(write_jsonl(tmp_path / "p.jsonl", rows)), rights=RIGHTS))
    grouped = group_pairs(pairs)
    joined = {"user:walk-b": "user:walk-a", "user:walk-a": "user:walk-a", "user:tmp-1": "user:tmp-1",
              "user:tmp-2": "user:tmp-1", "user:case": "user:case", "user:doc1": "user:case",
              "user:cross": "user:cross", "user:doc2": "user:cross"}
    expected = {p.pair_id: joined.get(p.pair_id, p.pair_id) for p in pairs if p.pair_id != "user:dup"}
    assert {p.pair_id: p.positive_group for p in grouped.pairs} == expected
    assert [p.pair_id for p in grouped.pairs] == [p.pair_id for p in pairs if p.pair_id != "user:dup"]
    assert dict(grouped.duplicates) == {"user:dup": "user:doc0"}
    assert grouped.groups == len(set(expected.values())) == 12
    # The order the pairs come in changes nothing.
    assert {p.pair_id: p.positive_group for p in group_pairs(pairs[::-1]).pairs} == expected

    landed = set()
    for seed in range(20):
        split = {p.pair_id: p.split for p in split_pairs(grouped, 0.25, 0.25, seed)}
        config = DataConfig(split_seed=seed, dev_fraction=0.25, test_fraction=0.25)
        assert split == {pair_id: split_of(group, config) for pair_id, group in expected.items()}
        assert split["user:walk-a"] == split["user:walk-b"] and split["user:tmp-1"] == split["user:tmp-2"]
        landed.add(split["user:walk-a"])
    assert landed == {"train", "dev", "test"}  # the group moves with the seed, always as a whole


def test_training_rows_fit_the_pair_schema(tmp_path, docs):
    """The train split as rows of PAIR_SCHEMA's fields (builder = source name, confidence 1.0, first
    positive) plus positives, negatives and scores; they make valid `Pair`s and the same pair table."""
    rows = [{"query": q, "positive": p, "negatives": [docs[(i + 1) % 10][1]], "score": 1 + i}
            for i, (q, p) in enumerate(docs)]
    pairs = read_pairs(PairFiles(name="mine", path=str(write_parquet(tmp_path / "p.parquet", rows)), rights=RIGHTS))
    split = split_pairs(group_pairs(pairs), 0.2, 0.2, seed=3)
    train = [p for p in split if p.split == "train"]
    assert len(train) == sum(split_of(p.pair_id, DataConfig(split_seed=3, dev_fraction=0.2, test_fraction=0.2))
                             == "train" for p in pairs) > 0
    table = user_pairs_to_table(split)
    assert table.schema == USER_PAIR_SCHEMA
    assert table.to_pylist() == user_pair_rows(split) == [
        {"pair_id": p.pair_id, "builder": "mine", "query": p.query, "positive": p.positives[0], "source": "mine",
         "doc_ids": [p.pair_id], "split": "train", "confidence": 1.0, "positive_group": p.pair_id,
         "positives": list(p.positives), "negatives": list(p.negatives), "scores": list(p.scores)} for p in train]
    frozen = [Pair(**{**row, "doc_ids": tuple(row["doc_ids"])}) for row in table.select(PAIR_SCHEMA.names).to_pylist()]
    assert pairs_to_table(frozen).equals(table.select(PAIR_SCHEMA.names))
    assert user_pair_rows(split, "dev") == user_pairs_to_table(split, "dev").to_pylist()


# ---------------------------------------------------------------------------------------------
# Provenance and Hugging Face datasets


def test_provenance_lists_file_hashes_rows_conventions_and_rights(tmp_path, docs):
    """Per file: relative path, bytes, sha256, rows and convention; the revision follows the bytes; the
    rights note and, when given, the read counts are recorded."""
    root = tmp_path / "pairs"
    write_jsonl(root / "a.jsonl", [{"anchor": q, "positive": p} for q, p in docs[:3]])
    write_csv(root / "b" / "c.csv", [{"question": q, "answer": p, "label": 1} for q, p in docs[3:5]])
    write_parquet(root / "d.parquet", [{"query": q, "positive": p, "negatives": []} for q, p in docs[5:9]])
    (root / "notes.txt").write_text("not pairs")
    source = PairFiles(name="prov", path=str(root), rights=RIGHTS)
    stats = PairReadStats()
    read_pairs(source, stats=stats)
    provenance = pair_source_provenance(source, stats)
    assert provenance["files"] == [
        {"path": name, "bytes": (root / name).stat().st_size,
         "sha256": hashlib.sha256((root / name).read_bytes()).hexdigest(), "rows": rows, "convention": convention}
        for name, rows, convention in (("a.jsonl", 3, "anchor-positive"), ("b/c.csv", 2, "question-answer+label"),
                                       ("d.parquet", 4, "query-positive-negatives"))]
    assert (provenance["kind"], provenance["path"], provenance["rights"]) == ("pair-files", str(root), RIGHTS)
    assert provenance["ignored_files"] == ["notes.txt"]
    assert provenance["read"]["pairs"] == 9 and provenance["read"]["conventions"] == stats.conventions
    before = provenance["revision"]
    write_jsonl(root / "a.jsonl", [{"anchor": q, "positive": p} for q, p in docs[:2]])
    assert pair_source_provenance(source)["revision"] != before


def test_hub_layout_directory_loads_through_datasets_by_revision(offline_hub, tmp_path, docs):
    """A local directory in the Hub's layout (README configs, data/<split>-*.parquet) loads by config,
    split and revision. datasets ignores the revision of a local directory, so another revision loads the
    same pairs and provenance pins the files by sha256; an edited file is read afresh, not from the cache."""
    root = tmp_path / "hub"
    root.mkdir()
    (root / "README.md").write_text(textwrap.dedent("""\
        ---
        configs:
        - config_name: triplets
          data_files:
          - split: train
            path: data/train-*.parquet
          - split: test
            path: data/test-*.parquet
        ---
        Triplets from the Python standard library's docstrings.
        """))
    train_rows = [{"anchor": q, "positive": p, "negative": docs[i + 5][1]} for i, (q, p) in enumerate(docs[:4])]
    train_file = write_parquet(root / "data" / "train-00000-of-00001.parquet", train_rows)
    write_parquet(root / "data" / "test-00000-of-00001.parquet",
                [{"anchor": docs[4][0], "positive": docs[4][1], "negative": ""},
                 {"anchor": docs[9][0], "positive": "   ", "negative": docs[0][1]}])
    source = HFPairs(name="hub", dataset=str(root), config="triplets", split="train", revision="v1.0", rights=RIGHTS)
    stats = PairReadStats()
    pairs = read_pairs(source, stats=stats)
    assert [(p.pair_id, p.locator) for p in pairs] == [(f"hub:train:{i}", f"train:{i}") for i in range(4)]
    assert content(pairs) == [(q, (p,), (docs[i + 5][1],), (None,)) for i, (q, p) in enumerate(docs[:4])]
    assert stats.conventions == {"train": "anchor-positive-negative"}
    other = dataclasses.replace(source, revision="0123456789abcdef0123456789abcdef01234567")
    assert read_pairs(other) == pairs  # the revision does nothing for a local directory

    provenance = pair_source_provenance(source)
    assert (provenance["config"], provenance["split"], provenance["revision"]) == ("triplets", "train", "v1.0")
    assert (provenance["revision_applies"], provenance["resolved_revision"], provenance["rows"]) == (False, None, 4)
    assert provenance["convention"] == "anchor-positive-negative" and provenance["rights"] == RIGHTS
    digest = hashlib.sha256(train_file.read_bytes()).hexdigest()
    assert {"split": "train", "path": str(train_file), "bytes": train_file.stat().st_size,
            "sha256": digest} in provenance["data_files"]
    combined = hashlib.sha256(f"data/train-00000-of-00001.parquet\0{digest}\n".encode()).hexdigest()
    assert provenance["content_revision"] == f"sha256:{combined}"

    write_parquet(train_file, train_rows[:2])  # edited in place: same path, new rows
    assert content(read_pairs(source)) == content(pairs)[:2]
    with pytest.raises(SourceError, match=r"dataset '.*hub' at revision 'v1.0' config 'triplets' "
                                          r"row test:1: column 'positive' is empty"):
        read_pairs(dataclasses.replace(source, split="test"))
