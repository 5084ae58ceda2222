"""External sources: local jsonl/parquet/txt files and pinned Hugging Face datasets read from local data."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedlab.sources.builtin import iter_documents
from embedlab.sources.external import (
    HFDataset,
    LocalFiles,
    ReadStats,
    SourceError,
    external_provenance,
    iter_external,
)


@pytest.fixture(scope="module")
def english() -> list[tuple[str, str]]:
    """(title, text) of five real English documents: Python's topic help."""
    return [(doc.title, doc.text) for doc in iter_documents("python-docs", limit=5)]


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, columns: dict[str, list[object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def read(source: LocalFiles | HFDataset, **kwargs) -> list:
    return list(iter_external(source, **kwargs))


# ---------------------------------------------------------------------------------------------
# Local files


def test_jsonl_ids_come_from_the_id_field_else_file_and_line(tmp_path, english):
    """JSON lines: <name>:<id> with an id, else <name>:<file>:<line> counted from 1 including blank lines."""
    (t0, x0), (_, x1), (t2, x2) = english[:3]
    file = write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "title": t0, "text": x0}, {"text": x1}])
    with file.open("a") as out:
        out.write("\n" + json.dumps({"id": None, "title": t2, "text": x2}) + "\n")
    docs = read(LocalFiles(name="mine", path=str(file)))
    assert [d.doc_id for d in docs] == ["mine:a", "mine:docs.jsonl:2", "mine:docs.jsonl:4"]
    assert [(d.title, d.text) for d in docs] == [(t0, x0.strip()), ("", x1.strip()), (t2, x2.strip())]
    assert {d.source for d in docs} == {"mine"}


def test_parquet_rows_become_documents_numbered_from_zero(tmp_path, english):
    """Parquet: one document per row, custom field names, row locators numbered from 0."""
    file = write_parquet(tmp_path / "p.parquet", {"body": [t for _, t in english], "name": [n for n, _ in english]})
    docs = read(LocalFiles(name="pq", path=str(file), text_field="body", title_field="name", id_field=None))
    assert [d.doc_id for d in docs] == [f"pq:p.parquet:{i}" for i in range(5)]
    assert [d.title for d in docs] == [title for title, _ in english]


def test_txt_is_one_document_per_file_titled_by_stem(tmp_path, english):
    """A .txt file is one document: title = file stem, id = <name>:<relative path>, text stripped."""
    text = english[0][1]
    (tmp_path / "notes.txt").write_text(f"\n{text}\n\n", encoding="utf-8")
    [doc] = read(LocalFiles(name="t", path=str(tmp_path / "notes.txt")))
    assert (doc.doc_id, doc.title, doc.text) == ("t:notes.txt", "notes", text.strip())


def test_directory_reads_all_formats_in_sorted_path_order(tmp_path, english):
    """A directory is read recursively in sorted relative-path order; other file types are listed, not read."""
    root = tmp_path / "corpus"
    write_jsonl(root / "b" / "x.jsonl", [{"text": english[0][1]}])
    write_parquet(root / "a.parquet", {"text": [english[1][1]]})
    (root / "b" / "a.txt").write_text(english[2][1], encoding="utf-8")
    (root / "README.md").write_text("not a document", encoding="utf-8")
    stats = ReadStats()
    docs = read(LocalFiles(name="dir", path=str(root)), stats=stats)
    assert [d.doc_id for d in docs] == ["dir:a.parquet:0", "dir:b/a.txt", "dir:b/x.jsonl:1"]
    assert stats.ignored_files == ["README.md"]
    assert (stats.records, stats.documents) == (3, 3)


def test_ids_and_provenance_are_stable_across_reads(tmp_path, english):
    """Two reads of the same files give the same ids, hashes and provenance revision."""
    write_jsonl(tmp_path / "d" / "a.jsonl", [{"text": text, "title": title} for title, text in english])
    write_parquet(tmp_path / "d" / "b.parquet", {"text": [text for _, text in english]})
    source = LocalFiles(name="s", path=str(tmp_path / "d"))
    first, second = read(source), read(source)
    assert [(d.doc_id, d.hash) for d in first] == [(d.doc_id, d.hash) for d in second]
    assert len({d.doc_id for d in first}) == 10
    assert external_provenance(source)["revision"] == external_provenance(source)["revision"]


def test_empty_and_missing_text_are_skipped_and_counted(tmp_path, english):
    """Empty, null, whitespace-only and absent text fields are dropped and counted by reason with locators."""
    write_jsonl(
        tmp_path / "a.jsonl",
        [{"text": english[0][1]}, {"text": ""}, {"text": None}, {"text": "  \n "}, {"title": "no text"}],
    )
    write_parquet(tmp_path / "b.parquet", {"text": [english[1][1], None]})
    (tmp_path / "c.txt").write_text("\n\n", encoding="utf-8")
    stats = ReadStats()
    docs = read(LocalFiles(name="s", path=str(tmp_path)), stats=stats)
    assert len(docs) == 2
    assert stats.skipped == {"empty text": 5, "missing field 'text'": 1}
    assert stats.skipped_examples["missing field 'text'"] == ["a.jsonl:5"]
    assert stats.skipped_examples["empty text"] == ["a.jsonl:2", "a.jsonl:3", "a.jsonl:4", "b.parquet:1", "c.txt"]
    assert stats.as_dict()["records"] == 8


def test_repeated_ids_get_suffixes_and_are_counted(tmp_path, english):
    """An id value that repeats gets ~2, ~3 in reading order, as the built-in sources do."""
    file = write_jsonl(tmp_path / "a.jsonl", [{"id": 7, "text": text} for _, text in english[:3]])
    stats = ReadStats()
    assert [d.doc_id for d in read(LocalFiles(name="s", path=str(file)), stats=stats)] == ["s:7", "s:7~2", "s:7~3"]
    assert stats.renamed_duplicate_ids == 2


def test_limit_stops_reading(tmp_path, english):
    """`limit` caps the documents, and the stats cover only what was read."""
    file = write_jsonl(tmp_path / "a.jsonl", [{"text": text} for _, text in english])
    stats = ReadStats()
    assert len(read(LocalFiles(name="s", path=str(file)), limit=2, stats=stats)) == 2
    assert stats.records == 2


def test_local_provenance_lists_files_with_sizes_and_hashes(tmp_path, english):
    """Local provenance: method, absolute path, per-file bytes and sha256, fields; the revision follows the bytes."""
    file = write_jsonl(tmp_path / "d" / "a.jsonl", [{"text": english[0][1]}])
    (tmp_path / "d" / "skip.csv").write_text("a,b\n", encoding="utf-8")
    source = LocalFiles(name="s", path=str(tmp_path / "d"), id_field=None)
    before = external_provenance(source)
    assert before["acquisition"] == "local-files"
    assert before["path"] == str((tmp_path / "d").resolve())
    assert before["files"] == [
        {"path": "a.jsonl", "bytes": file.stat().st_size, "sha256": hashlib.sha256(file.read_bytes()).hexdigest()}
    ]
    assert before["ignored_files"] == ["skip.csv"]
    assert before["fields"] == {"text": "text", "title": "title", "id": None}
    write_jsonl(file, [{"text": english[1][1]}])
    assert external_provenance(source)["revision"] != before["revision"]


def test_missing_path_is_named(tmp_path):
    """A path that does not exist raises at the call, naming the source and the path."""
    with pytest.raises(SourceError, match=r"'s'.*nowhere.* does not exist"):
        iter_external(LocalFiles(name="s", path=str(tmp_path / "nowhere")))


def test_unsupported_extension_lists_supported_ones(tmp_path):
    """A file of another type is refused with its name and the supported extensions."""
    (tmp_path / "data.csv").write_text("text\nhello\n", encoding="utf-8")
    supported = r"supported: \.jsonl, \.parquet, \.txt"
    with pytest.raises(SourceError, match=rf"data\.csv: unsupported file type '\.csv'; {supported}"):
        iter_external(LocalFiles(name="s", path=str(tmp_path / "data.csv")))
    with pytest.raises(SourceError, match=r"no \.jsonl, \.parquet, \.txt files in this directory \(1 other files\)"):
        iter_external(LocalFiles(name="s", path=str(tmp_path)))


def test_malformed_json_names_file_and_line(tmp_path, english):
    """A line that is not JSON, or not a JSON object, is an error naming the file and line."""
    file = write_jsonl(tmp_path / "bad.jsonl", [{"text": english[0][1]}])
    with file.open("a") as out:
        out.write('{"text": "unterminated\n')
    with pytest.raises(SourceError, match=r"bad\.jsonl line 2: malformed JSON"):
        read(LocalFiles(name="s", path=str(file)))
    write_jsonl(file, [["a", "list"]])
    with pytest.raises(SourceError, match=r"bad\.jsonl line 1: expected a JSON object, got list"):
        read(LocalFiles(name="s", path=str(file)))


def test_text_field_absent_from_every_record_names_field_and_fields_present(tmp_path, english):
    """A text field no record has is a wrong field name: the error names the file, the field and the fields seen."""
    file = write_jsonl(tmp_path / "a.jsonl", [{"body": text, "id": i} for i, (_, text) in enumerate(english)])
    with pytest.raises(SourceError, match=r"a\.jsonl: no record has the text field 'text'; fields present: body, id"):
        read(LocalFiles(name="s", path=str(file)))
    table = write_parquet(tmp_path / "b.parquet", {"body": [english[0][1]]})
    with pytest.raises(SourceError, match=r"b\.parquet: no record has the text field 'text'; fields present: body"):
        read(LocalFiles(name="s", path=str(table)))


def test_non_string_text_names_file_line_and_field(tmp_path):
    """A text field holding a number is an error naming the file, line, field and type."""
    file = write_jsonl(tmp_path / "a.jsonl", [{"text": 42}])
    with pytest.raises(SourceError, match=r"a\.jsonl line 1: field 'text' is int, expected a string"):
        read(LocalFiles(name="s", path=str(file)))


def test_undecodable_files_are_named(tmp_path):
    """Non-UTF-8 text and a corrupt Parquet file raise naming the file."""
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(SourceError, match=r"latin\.txt: not UTF-8"):
        read(LocalFiles(name="s", path=str(tmp_path / "latin.txt")))
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(SourceError, match=r"broken\.parquet: not a readable Parquet file"):
        read(LocalFiles(name="s", path=str(tmp_path / "broken.parquet")))


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets, on local data with the hub switched off


@pytest.fixture
def local_dataset(tmp_path, english) -> Path:
    """A dataset directory as datasets reads it: one Parquet file per split, named after the split."""
    root = tmp_path / "dataset"
    write_parquet(root / "train.parquet", {"uid": ["t0", "t1"], "name": [english[0][0], english[1][0]],
                                           "body": [english[0][1], english[1][1]]})
    write_parquet(root / "test.parquet", {"uid": ["s0", "s1", "s2"], "name": [t for t, _ in english[2:]],
                                          "body": [english[2][1], "", english[4][1]]})
    return root


def hf_source(root: Path, **overrides) -> HFDataset:
    fields = dict(name="hf", dataset=str(root), revision="v1", split="test", text_field="body",
                  title_field="name", id_field="uid")
    return HFDataset(**{**fields, **overrides})


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_dataset_reads_a_local_dataset(offline_hub, local_dataset, english, streaming):
    """load_dataset on a local directory yields the requested split's rows, skipping empty text."""
    stats = ReadStats()
    docs = read(hf_source(local_dataset, streaming=streaming), stats=stats)
    assert [(d.doc_id, d.title, d.text) for d in docs] == [
        ("hf:s0", english[2][0], english[2][1].strip()),
        ("hf:s2", english[4][0], english[4][1].strip()),
    ]
    assert stats.skipped_examples == {"empty text": ["test:1"]}
    assert read(hf_source(local_dataset, id_field=None, split="train"))[1].doc_id == "hf:train:1"


def test_hf_provenance_records_requested_and_resolved_revision(offline_hub, local_dataset):
    """HF provenance: method, dataset, requested revision, datasets' resolved hash, data files with sha256."""
    provenance = external_provenance(hf_source(local_dataset))
    assert provenance["acquisition"] == "huggingface-datasets"
    assert (provenance["dataset"], provenance["revision"], provenance["split"]) == (str(local_dataset), "v1", "test")
    assert provenance["resolved_revision"] and provenance["resolved_revision"] != "v1"
    test_file = local_dataset / "test.parquet"
    assert {"split": "test", "path": str(test_file), "bytes": test_file.stat().st_size,
            "sha256": hashlib.sha256(test_file.read_bytes()).hexdigest()} in provenance["data_files"]
    assert provenance["fields"] == {"text": "body", "title": "name", "id": "uid"}


def test_hf_missing_text_column_names_dataset_and_columns(offline_hub, local_dataset):
    """A text field the dataset lacks is an error naming the dataset, revision, field and columns."""
    expected = r"revision 'v1'.*no record has the text field 'text'; fields present: uid, name, body"
    with pytest.raises(SourceError, match=expected):
        read(hf_source(local_dataset, text_field="text"))


def test_hf_unknown_split_is_a_source_error(offline_hub, local_dataset):
    """datasets' own errors (here an unknown split) become SourceError naming dataset and revision."""
    with pytest.raises(SourceError, match=r"dataset '.*dataset' at revision 'v1' split 'validation'.*Unknown split"):
        iter_external(hf_source(local_dataset, split="validation"))


@pytest.mark.timeout(30)
def test_unreachable_hub_dataset_fails_fast(offline_hub):
    """A hub dataset that cannot be reached raises SourceError naming it and its revision, without hanging."""
    with pytest.raises(SourceError, match=r"'no-such-org/no-such-dataset' at revision 'abc123'.*ConnectionError"):
        iter_external(HFDataset(name="x", dataset="no-such-org/no-such-dataset", revision="abc123"))


@pytest.mark.parametrize("revision", ["", "  ", None])
def test_hf_dataset_requires_a_revision(revision):
    """An HFDataset without a revision is refused, and the message says pinning is why."""
    with pytest.raises(SourceError, match=r"needs a revision .*could change between runs"):
        HFDataset(name="x", dataset="some/dataset", revision=revision)
