"""Sources beyond the built-in corpus: local files and pinned Hugging Face datasets.

Each source yields `Document`s (through `iter_external`) and says where they came from
(through `external_provenance`).

    LocalFiles  a file, or a directory searched recursively in sorted path order, of
                *.jsonl   one JSON object per line, one document per object (blank lines ignored)
                *.parquet one document per row
                *.txt     one document per file, titled with the file's stem: a paragraph is
                          too small a unit for retrieval text and splitting is a later stage's job
    HFDataset   `datasets.load_dataset` at a required revision, one document per row

Document ids are stable across reads: `<name>:<id>` when the record has a value in `id_field`,
else `<name>:<locator>` where the locator is `<relative path>:<line>` (JSON lines, numbered
from 1 like an editor), `<relative path>:<row>` (Parquet, numbered from 0 like the file),
`<split>:<row>` (Hugging Face), or `<relative path>` (text files). An id that repeats an
earlier one gets "~2", "~3", ... in reading order, as the built-in sources do. Text is kept
as read, less leading and trailing whitespace.

Records whose text is empty, null or whitespace, or that lack the text field while other
records have it, are skipped and counted in a `ReadStats`. Everything else that is wrong
raises `SourceError` naming the file and line or row and the field: a missing path, an
unsupported file type, a malformed JSON line, a text field that is not a string, or a text
field that no record of a file (or dataset) has, which is a wrong field name, not bad rows.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, NoReturn

from embedlab.core.config.sources import ExternalSource, HFDataset, LocalFiles, SourceError
from embedlab.core.errors import quoted_names
from embedlab.sources.document import Document

SUPPORTED_EXTENSIONS = (".jsonl", ".parquet", ".txt")
MAX_SKIPPED_EXAMPLES = 5  # locators kept per skip reason, enough to find the bad rows
_PARQUET_BATCH_ROWS = 1024


@dataclass
class ReadStats:
    """What one `iter_external` call read and dropped; fills in as the documents are consumed.

    With a `limit`, reading stops at the limit and the counts cover the records read so far.
    """

    records: int = 0  # rows, JSON lines and text files looked at
    documents: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> records dropped
    skipped_examples: dict[str, list[str]] = field(default_factory=dict)  # reason -> first few locators
    renamed_duplicate_ids: int = 0
    ignored_files: list[str] = field(default_factory=list)  # directory entries of unsupported types

    def skip(self, reason: str, locator: str) -> None:
        self.skipped[reason] += 1
        examples = self.skipped_examples.setdefault(reason, [])
        if len(examples) < MAX_SKIPPED_EXAMPLES:
            examples.append(locator)

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "documents": self.documents,
            "skipped": dict(self.skipped),
            "skipped_examples": self.skipped_examples,
            "renamed_duplicate_ids": self.renamed_duplicate_ids,
            "ignored_files": self.ignored_files,
        }


def iter_external(
    source: ExternalSource, *, limit: int | None = None, stats: ReadStats | None = None
) -> Iterator[Document]:
    """The documents of an external source in a fixed order, at most `limit` of them.

    A missing path or an unloadable dataset raises here, not on the first next(); pass a
    `ReadStats` to learn what was skipped and why.
    """
    stats = stats if stats is not None else ReadStats()
    if isinstance(source, LocalFiles):
        files, ignored = _local_files(source)
        stats.ignored_files.extend(ignored)
        records = _local_records(source, files)
    else:
        records = _hf_records(source, _load_hf(source))
    return islice(_documents(source, records, stats), limit)


def external_provenance(source: ExternalSource) -> dict[str, Any]:
    """Where a source's documents come from, precisely enough to get the same documents again."""
    fields = {"text": source.text_field, "title": source.title_field, "id": source.id_field}
    if isinstance(source, LocalFiles):
        return _local_provenance(source, fields)
    return _hf_provenance(source, fields)


# ---------------------------------------------------------------------------------------------
# Records to documents

_MISSING = object()  # a field absent from a record, as opposed to present and null


@dataclass(frozen=True)
class _Record:
    locator: str  # the doc-id suffix when the record has no id: "docs/a.jsonl:3"
    where: str  # the same place for error messages: "/data/docs/a.jsonl line 3"
    text: object
    title: object = None
    id: object = None


def _documents(source: ExternalSource, records: Iterable[_Record], stats: ReadStats) -> Iterator[Document]:
    seen: dict[str, int] = {}
    for record in records:
        stats.records += 1
        if record.text is _MISSING:
            stats.skip(f"missing field {source.text_field!r}", record.locator)
            continue
        if record.text is not None and not isinstance(record.text, str):
            raise SourceError(
                f"{record.where}: field {source.text_field!r} is {type(record.text).__name__}, expected a string"
            )
        text = (record.text or "").strip()
        if not text:
            stats.skip("empty text", record.locator)
            continue
        has_id = record.id not in (None, "", _MISSING)
        doc_id = f"{source.name}:{record.id if has_id else record.locator}"
        count = seen[doc_id] = seen.get(doc_id, 0) + 1
        if count > 1:
            stats.renamed_duplicate_ids += 1
            doc_id = f"{doc_id}~{count}"
        title = "" if record.title in (None, _MISSING) else str(record.title)
        stats.documents += 1
        yield Document(doc_id=doc_id, source=source.name, title=title, text=text)


def _mapped_records(
    source: ExternalSource, rows: Iterable[tuple[str, str, Mapping[str, Any]]], scope: str
) -> Iterator[_Record]:
    """Records from (locator, where, row) triples of one file or dataset split.

    If no row has the text field, the field name is wrong: that raises, naming the first row's fields.
    """
    field_seen = False
    first_fields: list[str] | None = None
    for locator, where, row in rows:
        if first_fields is None:
            first_fields = sorted(row)
        field_seen = field_seen or source.text_field in row
        yield _Record(
            locator,
            where,
            row.get(source.text_field, _MISSING),
            row.get(source.title_field, _MISSING) if source.title_field else None,
            row.get(source.id_field, _MISSING) if source.id_field else None,
        )
    if first_fields is not None and not field_seen:
        _raise_missing_column(scope, source.text_field, first_fields)


def _raise_missing_column(scope: str, text_field: str, present: Iterable[str]) -> NoReturn:
    raise SourceError(
        f"{scope}: no record has the text field {text_field!r}; fields present: {quoted_names(present)}"
    )


# ---------------------------------------------------------------------------------------------
# Local files


def _local_files(source: LocalFiles) -> tuple[list[Path], list[str]]:
    """(files to read, in sorted relative-path order; relative paths of ignored files)."""
    root = Path(source.path)
    supported = ", ".join(SUPPORTED_EXTENSIONS)
    if not root.exists():
        raise SourceError(f"source {source.name!r}: path {root} does not exist")
    if root.is_file():
        if root.suffix.lower() not in SUPPORTED_EXTENSIONS:
            raise SourceError(f"{root}: unsupported file type {root.suffix!r}; supported: {supported}")
        return [root], []
    entries = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix())
    files = [p for p in entries if p.suffix.lower() in SUPPORTED_EXTENSIONS]
    ignored = [p.relative_to(root).as_posix() for p in entries if p.suffix.lower() not in SUPPORTED_EXTENSIONS]
    if not files:
        raise SourceError(f"{root}: no {supported} files in this directory ({len(ignored)} other files)")
    return files, ignored


def _relative(source: LocalFiles, file: Path) -> str:
    root = Path(source.path)
    return file.name if root.is_file() else file.relative_to(root).as_posix()


def _local_records(source: LocalFiles, files: list[Path]) -> Iterator[_Record]:
    for file in files:
        relative = _relative(source, file)
        suffix = file.suffix.lower()
        if suffix == ".txt":
            yield _Record(relative, str(file), _read_utf8(file, file.read_bytes()), file.stem)
        elif suffix == ".jsonl":
            yield from _mapped_records(source, jsonl_rows(file, relative), str(file))
        else:
            yield from _mapped_records(source, _parquet_rows(source, file, relative), str(file))


def _read_utf8(where: Path | str, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")  # -sig: a byte-order mark is not text
    except UnicodeDecodeError as error:
        raise SourceError(f"{where}: not UTF-8 (byte {error.start}: {error.reason})") from None


def jsonl_rows(file: Path, relative: str) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(locator "<relative>:<line>", where for errors, object) of each non-blank line of a JSON
    lines file; SourceError naming the line for bad UTF-8, bad JSON or a line that is no object."""
    with file.open("rb") as lines:  # bytes, so a decoding error can name its line
        for number, raw in enumerate(lines, 1):
            where = f"{file} line {number}"
            line = _read_utf8(where, raw)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise SourceError(f"{where}: malformed JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(row, dict):
                raise SourceError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield f"{relative}:{number}", where, row


def _parquet_rows(source: LocalFiles, file: Path, relative: str) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file)
    except (pa.ArrowException, OSError) as error:
        raise SourceError(f"{file}: not a readable Parquet file ({error})") from None
    columns = parquet.schema_arrow.names
    if source.text_field not in columns:  # known from the schema: no need to scan the rows
        _raise_missing_column(str(file), source.text_field, columns)
    wanted = [c for c in (source.text_field, source.title_field, source.id_field) if c in columns]
    number = 0
    for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=wanted):
        for row in batch.to_pylist():
            yield f"{relative}:{number}", f"{file} row {number}", row
            number += 1


def file_entry(file: Path, relative: str) -> dict[str, Any]:
    """A provenance entry for one read file: its `relative` path, size and sha256."""
    with file.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return {"path": relative, "bytes": file.stat().st_size, "sha256": digest}


def _local_provenance(source: LocalFiles, fields: dict[str, str | None]) -> dict[str, Any]:
    files, ignored = _local_files(source)
    entries = [file_entry(file, _relative(source, file)) for file in files]
    # The revision covers names as well as bytes: a renamed file changes document ids.
    combined = hashlib.sha256("".join(f"{e['path']}\0{e['sha256']}\n" for e in entries).encode())
    return {
        "name": source.name,
        "acquisition": "local-files",
        "path": str(Path(source.path).resolve()),
        "revision": f"sha256:{combined.hexdigest()}",
        "files": entries,
        "ignored_files": ignored,
        "fields": fields,
    }


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets


def _hf_scope(source: HFDataset) -> str:
    config = f" config {source.config!r}" if source.config else ""
    return f"Hugging Face dataset {source.dataset!r} at revision {source.revision!r}{config} split {source.split!r}"


def _hf_error(source: HFDataset, error: Exception) -> SourceError:
    return SourceError(f"{_hf_scope(source)}: {type(error).__name__}: {error}")


def _load_hf(source: HFDataset) -> Any:
    # Imported here: `datasets` takes seconds to import and only this source needs it.
    import datasets

    try:
        return datasets.load_dataset(
            source.dataset, name=source.config, split=source.split, revision=source.revision, streaming=source.streaming
        )
    except Exception as error:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ValueError, ...)
        raise _hf_error(source, error) from error


def _hf_records(source: HFDataset, dataset: Any) -> Iterator[_Record]:
    scope = _hf_scope(source)
    if dataset.column_names is not None and source.text_field not in dataset.column_names:
        _raise_missing_column(scope, source.text_field, dataset.column_names)
    yield from _mapped_records(source, _hf_rows(source, dataset), scope)


def _hf_rows(source: HFDataset, dataset: Any) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    rows = iter(dataset)
    number = 0
    while True:
        try:  # a streaming dataset fetches as it goes, so reading can fail like loading
            row = next(rows)
        except StopIteration:
            return
        except Exception as error:
            raise _hf_error(source, error) from error
        yield f"{source.split}:{number}", f"{_hf_scope(source)} row {number}", row
        number += 1


def _hf_provenance(source: HFDataset, fields: dict[str, str | None]) -> dict[str, Any]:
    import datasets

    try:
        # The builder resolves the revision and lists the data files without downloading them.
        builder = datasets.load_dataset_builder(source.dataset, name=source.config, revision=source.revision)
    except Exception as error:
        raise _hf_error(source, error) from error
    data_files = []
    for split, paths in (builder.config.data_files or {}).items():
        for path in paths:
            local = Path(path)
            entry = file_entry(local, str(local)) if local.is_file() else {"path": str(path)}
            data_files.append({"split": str(split), **entry})
    return {
        "name": source.name,
        "acquisition": "huggingface-datasets",
        "dataset": source.dataset,
        "config": builder.config.name,
        "split": source.split,
        "revision": source.revision,
        # For a hub dataset the commit the revision resolved to; for a local directory datasets'
        # hash of its data files' paths and modification times (their sha256 are in data_files).
        "resolved_revision": builder.hash,
        "streaming": source.streaming,
        "data_files": data_files,
        "fields": fields,
        "datasets_version": datasets.__version__,
    }
