"""A user's own labelled (query, positive[, negatives]) pairs, read so they can be mixed with the
built-in pair builders (`embedlab.pairs.builders`).

    PairFiles   a .jsonl, .parquet or .csv file, or a directory searched recursively in sorted
                relative-path order (other files are listed, not read)
    HFPairs     `datasets.load_dataset(dataset, name=config, split=split, revision=revision)`
    BEIRPairs   a BEIR folder's training judgements: corpus.jsonl, queries.jsonl, qrels/<split>.tsv

Every source carries a `rights` note, the user's statement of the licence or permission the
pairs are used under; it is required (labelled sets are often licensed for research only) and
goes into `pair_source_provenance`.

Columns. Unless the source maps them itself (`query_field` and `positive_field`, plus optional
`negative_fields`, `negatives_field`, `score_field`), the columns are recognised from the first
record of each file (a JSONL file's first object, a CSV header, a Parquet or dataset schema):
the query and positive are the first of these pairs present,

    anchor, positive        sentence-transformers' (anchor, positive[, negative | negative_1..n])
    query, positive         sentence-transformers' (query, positive, negatives: a list)
    sentence1, sentence2    pair datasets such as STS or paraphrase sets
    question, answer        question answering sets

and negatives are `negative`, then `negative_1`, `negative_2`, ... in numeric order, then the
items of a `negatives` list, whichever are present. A `score` column, else a `label` column,
says whether a row is a positive pair at all: a row with score <= 0 is a negative example of a
pair-classification set, not a pair to train on, so it is skipped and counted. A `label` must
be 0 or 1: a multi-class label (NLI's 0 entailment, 1 neutral, 2 contradiction) does not say
which rows are positives, so any other value is an error. An explicit `score_field` follows the
score rule. `id_field` (default "id") names an optional id column. CSV has no list type: a list
column's cell holds a JSON array (an empty cell is no negatives); a score cell is parsed as a number.

Validation. Each of these raises `SourceError` naming the file and line (JSONL and CSV, counted
from 1 like an editor, the CSV header being line 1) or row (Parquet, from 0; Hugging Face,
`<split>:<row>`) and the column: a missing query or positive column, a query or positive that
is null, empty or whitespace, a text that is not a string, a malformed score or label. What is
merely redundant is dropped and counted in `PairReadStats` instead: a negative that is null,
empty or absent from a record, equals the query or a positive, or repeats an earlier negative
(equality after NFKC, whitespace collapsing and case folding); a positive that equals the query
(a row left with no positive is skipped).

Pairs. `read_pairs` gives `UserPair` records: pair_id `<name>:<id>` when the record has an id,
else `<name>:<locator>`, the locator being `<relative path>:<line>` (JSONL, CSV),
`<relative path>:<row>` (Parquet), `<split>:<row>` (Hugging Face) or `<split>:<query id>`
(BEIR); a repeated id gets "~2", "~3", ... in reading order, as `external` does. A BEIR query
becomes ONE pair whose positives are all its documents judged > 0, best grade first (ties by
document id), each with its grade as its score; its text is the BEIR evaluator's ("title. text").

Groups and splits. `group_pairs` removes exact duplicate pairs and puts pairs whose texts are
near duplicates into one positive group; `split_pairs` assigns train/dev/test by a seeded hash
of the group, so near-duplicate queries never straddle splits. `user_pair_rows` and
`user_pairs_to_table` give one split's pairs as rows of `pairs.PAIR_SCHEMA` plus the positives,
negatives and scores columns.

Rows. A pair gives one training row per positive, (query, positive i), so every positive is
trained on: a BEIR query with three relevant documents is three rows. The rows share the pair's
positive group, so they are never each other's in-batch negatives, and each carries the pair's
documents, all its positives and its given negatives. A row's id is the pair id when the pair
has one positive, else `<pair id>#<i>` (i from 0, best positive first). A row is the unit of
`contrastive.pairs` shares and of the pair budget: a pair with three positives counts as three
positive pairs, as three built-in pairs would.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, NoReturn

import pyarrow as pa

from embedlab.sources.corpus import SPLITS
from embedlab.sources.dedup import near_duplicate_clusters
from embedlab.sources.document import normalise_text
from embedlab.sources.external import MAX_SKIPPED_EXAMPLES, SourceError, file_entry, jsonl_rows
# The configs live beside `embedlab.core.config`, which holds them; imported from here as before.
from embedlab.core.config.sources import BEIRPairs, ColumnMapping, HFPairs, PairFiles, PairSource  # noqa: F401
from embedlab.core import beir
from embedlab.core.errors import quoted, quoted_names
from embedlab.pairs.builders import PAIR_SCHEMA, SmallestRootSets

PAIR_FILE_EXTENSIONS = (".jsonl", ".parquet", ".csv")
USER_PAIR_CONFIDENCE = 1.0  # a person labelled these pairs; a trainer may still weight by `scores`
# (query column, positive column) of the conventions recognised without a mapping, first match wins.
CONVENTIONS = (("anchor", "positive"), ("query", "positive"), ("sentence1", "sentence2"), ("question", "answer"))
NEGATIVE_COLUMN = "negative"
NEGATIVES_LIST_COLUMN = "negatives"
_NUMBERED_NEGATIVE = re.compile(r"negative_([0-9]+)")
BEIR_CONVENTION = "beir-qrels"
_PARQUET_BATCH_ROWS = 1024

Row = Mapping[str, Any]
_MISSING = object()  # a column absent from a record, as opposed to present and null


# ---------------------------------------------------------------------------------------------
# Records and counts


@dataclass(frozen=True, kw_only=True)
class UserPair:
    """One labelled query with its positives (one for row data, all judged ones for BEIR) and negatives.

    `scores[i]` is positive i's score (a score or label column, a BEIR grade; None without
    one). `doc_ids` are the positives' corpus ids for BEIR (`<name>:<corpus id>`), else the
    pair id. `positive_group` is set by `group_pairs`, `split` by `split_pairs`.
    """

    pair_id: str
    source: str
    locator: str
    query: str
    positives: tuple[str, ...]
    scores: tuple[float | None, ...]
    negatives: tuple[str, ...] = ()
    doc_ids: tuple[str, ...]
    positive_group: str | None = None
    split: str | None = None

    def __post_init__(self) -> None:
        if not self.query.strip() or not self.positives or not all(p.strip() for p in self.positives):
            raise ValueError(f"pair {self.pair_id!r}: empty query or no positive")
        if len(self.scores) != len(self.positives):
            raise ValueError(f"pair {self.pair_id!r}: {len(self.scores)} scores for {len(self.positives)} positives")
        if not self.doc_ids:
            raise ValueError(f"pair {self.pair_id!r}: no doc_ids")
        if self.split is not None and self.split not in SPLITS:
            raise ValueError(f"pair {self.pair_id!r}: unknown split {self.split!r}")

    @property
    def score(self) -> float | None:
        """The first (best) positive's score."""
        return self.scores[0]


@dataclass
class PairReadStats:
    """What one `read_pairs` call read, skipped and dropped.

    `skipped` counts records that gave no pair; `dropped` counts texts removed from records
    (negatives, positives equal to the query), whether or not the record still made a pair.
    """

    records: int = 0  # rows, JSON lines, CSV records, judged BEIR queries looked at
    pairs: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> records
    skipped_examples: dict[str, list[str]] = field(default_factory=dict)  # reason -> first few locators
    dropped: Counter[str] = field(default_factory=Counter)  # reason -> texts
    dropped_examples: dict[str, list[str]] = field(default_factory=dict)
    renamed_duplicate_ids: int = 0
    ignored_files: list[str] = field(default_factory=list)  # directory entries of unsupported types
    conventions: dict[str, str] = field(default_factory=dict)  # file (relative path) or split -> convention

    def skip(self, reason: str, locator: str) -> None:
        self.skipped[reason] += 1
        _example(self.skipped_examples, reason, locator)

    def drop(self, reason: str, locator: str) -> None:
        self.dropped[reason] += 1
        _example(self.dropped_examples, reason, locator)

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "pairs": self.pairs,
            "skipped": dict(self.skipped),
            "skipped_examples": self.skipped_examples,
            "dropped": dict(self.dropped),
            "dropped_examples": self.dropped_examples,
            "renamed_duplicate_ids": self.renamed_duplicate_ids,
            "ignored_files": self.ignored_files,
            "conventions": self.conventions,
        }


def _example(examples: dict[str, list[str]], reason: str, locator: str) -> None:
    kept = examples.setdefault(reason, [])
    if len(kept) < MAX_SKIPPED_EXAMPLES:
        kept.append(locator)


# ---------------------------------------------------------------------------------------------
# Entry points


def read_pairs(source: PairSource, *, stats: PairReadStats | None = None) -> list[UserPair]:
    """Every pair of a source in a fixed order; pass a `PairReadStats` to learn what was dropped and why."""
    stats = stats if stats is not None else PairReadStats()
    ids = _Ids(source.name, stats)
    if isinstance(source, BEIRPairs):
        return list(_beir_pairs(source, stats, ids))
    if isinstance(source, PairFiles):
        files, ignored = _pair_files(source)
        stats.ignored_files.extend(ignored)
        tables = (_open_file(file, _relative(source, file)) for file in files)
    else:
        tables = iter([_hf_table(source, _load_hf(source))])
    pairs = []
    for table in tables:
        mapping = _resolve_mapping(source, table.columns, table.scope)
        if mapping is None:  # an empty file: nothing to read, nothing to recognise
            continue
        stats.conventions[table.name] = mapping.convention
        for locator, where, row in table.rows:
            pair = _row_pair(source, mapping, table.json_lists, locator, where, row, stats, ids)
            if pair is not None:
                pairs.append(pair)
    return pairs


def pair_source_provenance(source: PairSource, stats: PairReadStats | None = None) -> dict[str, Any]:
    """Where a source's pairs come from, precisely enough to get the same pairs again.

    Files are listed with bytes, sha256 (streamed) and rows; `revision` combines the names
    and hashes. Pass the `stats` of a `read_pairs` call to record what it kept and dropped.
    """
    if isinstance(source, PairFiles):
        provenance = _files_provenance(source)
    elif isinstance(source, HFPairs):
        provenance = _hf_provenance(source)
    else:
        provenance = _beir_provenance(source)
    provenance["rights"] = source.rights
    if stats is not None:
        provenance["read"] = stats.as_dict()
    return provenance


# ---------------------------------------------------------------------------------------------
# Columns


@dataclass(frozen=True)
class _Mapping:
    """The columns one file or split is read with."""

    convention: str  # "anchor-positive-negative_n+score", "explicit", ...
    query: str
    positive: str
    negatives: tuple[str, ...]
    negatives_list: str | None
    score: str | None
    score_is_label: bool  # a 0/1 label rather than a score


def _resolve_mapping(source: HFPairs | PairFiles, columns: Sequence[str] | None, scope: str) -> _Mapping | None:
    """The source's explicit mapping, else the first convention the columns fit (None: no columns known)."""
    if source.query_field is not None and source.positive_field is not None:
        return _Mapping("explicit", source.query_field, source.positive_field, source.negative_fields,
                        source.negatives_field, source.score_field, False)
    if columns is None:
        return None
    present = set(columns)
    for query, positive in CONVENTIONS:
        if query in present and positive in present:
            break
    else:
        expected = "; ".join(f"{q} + {p}" for q, p in CONVENTIONS)
        raise SourceError(
            f"{scope}: no pair columns among {quoted_names(columns)}; expected one of: {expected}; "
            "or map them with query_field and positive_field"
        )
    numbered = sorted((c for c in columns if _NUMBERED_NEGATIVE.fullmatch(c)), key=lambda c: int(c.split("_")[1]))
    negatives = ([NEGATIVE_COLUMN] if NEGATIVE_COLUMN in present else []) + numbered
    negatives_list = NEGATIVES_LIST_COLUMN if NEGATIVES_LIST_COLUMN in present else None
    score = "score" if "score" in present else "label" if "label" in present else None
    parts = [query, positive]
    parts += [NEGATIVE_COLUMN] if NEGATIVE_COLUMN in present else []
    parts += ["negative_n"] if numbered else []
    parts += [NEGATIVES_LIST_COLUMN] if negatives_list else []
    convention = "-".join(parts) + (f"+{score}" if score else "")
    return _Mapping(convention, query, positive, tuple(negatives), negatives_list, score, score == "label")


def _mapping_dict(source: HFPairs | PairFiles) -> dict[str, Any]:
    return {"query": source.query_field, "positive": source.positive_field,
            "negatives": list(source.negative_fields), "negatives_list": source.negatives_field,
            "score": source.score_field, "id": source.id_field}


# ---------------------------------------------------------------------------------------------
# Rows to pairs


class _Ids:
    """Pair ids of one read: `<name>:<id or locator>`, a repeat suffixed "~2", "~3", ..."""

    def __init__(self, name: str, stats: PairReadStats) -> None:
        self.name, self.stats, self.seen = name, stats, Counter[str]()

    def __call__(self, key: str) -> str:
        pair_id = f"{self.name}:{key}"
        self.seen[pair_id] += 1
        if self.seen[pair_id] > 1:
            self.stats.renamed_duplicate_ids += 1
            return f"{pair_id}~{self.seen[pair_id]}"
        return pair_id


def _fold(text: str) -> str:
    """The form texts are compared in: NFKC, whitespace collapsed, case folded."""
    return normalise_text(text).casefold()


def _missing(where: str, column: str, row: Row) -> NoReturn:
    raise SourceError(f"{where}: missing column {column!r}; columns present: {quoted_names(row)}")


def _required_text(where: str, column: str, row: Row) -> str:
    value = row.get(column, _MISSING)
    if value is _MISSING:
        _missing(where, column, row)
    if value is None:
        raise SourceError(f"{where}: column {column!r} is null")
    if not isinstance(value, str):
        raise SourceError(f"{where}: column {column!r} is {type(value).__name__}, expected a string")
    if not value.strip():
        raise SourceError(f"{where}: column {column!r} is empty")
    return value.strip()


def _optional_text(where: str, column: str, value: object) -> str:
    """A negative's text, '' when null or absent; anything but a string raises."""
    if value is _MISSING or value is None:
        return ""
    if not isinstance(value, str):
        raise SourceError(f"{where}: column {column!r} is {type(value).__name__}, expected a string")
    return value.strip()


def _negatives_list(where: str, column: str, value: object, json_lists: bool) -> list[tuple[str, object]]:
    """(column[index], item) of a list column; with `json_lists` (CSV) the cell holds a JSON array."""
    if value is _MISSING or value is None or (json_lists and value == ""):
        return []
    if json_lists and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise SourceError(f"{where}: column {column!r} is not a JSON array ({error.msg})") from None
    if not isinstance(value, list):
        raise SourceError(f"{where}: column {column!r} is {type(value).__name__}, expected a list of strings")
    return [(f"{column}[{i}]", item) for i, item in enumerate(value)]


def _score(where: str, mapping: _Mapping, row: Row) -> float:
    column = mapping.score
    assert column is not None
    value = row.get(column, _MISSING)
    if value is _MISSING:
        _missing(where, column, row)
    number: float | None = None
    if isinstance(value, bool | int | float):
        number = float(value)
    elif isinstance(value, str):  # CSV
        try:
            number = float(value.strip())
        except ValueError:
            pass
    if number is None or not math.isfinite(number):  # NaN and inf: no score says whether a row is a positive
        shown = ("NaN" if math.isnan(number) else f"{number:g}") if number is not None else (
            "text that is not a number" if isinstance(value, str) else f"a {type(value).__name__}")
        raise SourceError(f"{where}: column {column!r} is {shown}, expected a finite number")
    if mapping.score_is_label and number not in (0.0, 1.0):
        raise SourceError(
            f"{where}: column {column!r} is {number:g}; a label must be 0 or 1 (1: a positive pair). A multi-class "
            "label such as NLI's (0 entailment, 1 neutral, 2 contradiction) does not say which rows are positives: "
            "keep the rows you mean, or map a score column with query_field, positive_field and score_field"
        )
    return number


def _row_pair(
    source: HFPairs | PairFiles,
    mapping: _Mapping,
    json_lists: bool,
    locator: str,
    where: str,
    row: Row,
    stats: PairReadStats,
    ids: _Ids,
) -> UserPair | None:
    stats.records += 1
    # Every check that can raise comes first: a malformed row is an error even if it would be skipped.
    query = _required_text(where, mapping.query, row)
    positive = _required_text(where, mapping.positive, row)
    score = _score(where, mapping, row) if mapping.score else None
    negatives = [(c, _optional_text(where, c, row.get(c, _MISSING))) for c in mapping.negatives]
    if mapping.negatives_list:
        items = _negatives_list(where, mapping.negatives_list, row.get(mapping.negatives_list, _MISSING), json_lists)
        negatives += [(c, _optional_text(where, c, item)) for c, item in items]
    if score is not None and score <= 0:
        stats.skip(f"{mapping.score} <= 0 (not a positive pair)", locator)
        return None
    key = row.get(source.id_field) if source.id_field else None
    has_id = key not in (None, "")
    return _assemble(ids, stats, locator, str(key) if has_id else locator, query,
                     [(positive, score, None)], [text for _, text in negatives])


def _assemble(
    ids: _Ids,
    stats: PairReadStats,
    locator: str,
    key: str,
    query: str,
    positives: list[tuple[str, float | None, str | None]],
    negatives: list[str],
) -> UserPair | None:
    """A pair from validated texts (positives as (text, score, corpus id)), redundant texts dropped and counted."""
    folded_query = _fold(query)
    kept: list[tuple[str, float | None, str | None]] = []
    seen_positives: set[str] = set()
    for positive in positives:
        folded = _fold(positive[0])
        if folded == folded_query:
            stats.drop("positive equals query", locator)
        elif folded in seen_positives:
            stats.drop("repeated positive", locator)
        else:
            seen_positives.add(folded)
            kept.append(positive)
    if not kept:
        stats.skip("no positive left", locator)
        return None
    kept_negatives: list[str] = []
    seen_negatives: set[str] = set()
    for negative in negatives:
        folded = _fold(negative)
        if not folded:
            stats.drop("empty negative", locator)
        elif folded in seen_positives:
            stats.drop("negative equals positive", locator)
        elif folded == folded_query:
            stats.drop("negative equals query", locator)
        elif folded in seen_negatives:
            stats.drop("repeated negative", locator)
        else:
            seen_negatives.add(folded)
            kept_negatives.append(negative)
    pair_id = ids(key)
    stats.pairs += 1
    corpus_ids = tuple(f"{ids.name}:{doc}" for _, _, doc in kept if doc is not None)
    return UserPair(
        pair_id=pair_id,
        source=ids.name,
        locator=locator,
        query=query,
        positives=tuple(text for text, _, _ in kept),
        scores=tuple(score for _, score, _ in kept),
        negatives=tuple(kept_negatives),
        doc_ids=corpus_ids or (pair_id,),
    )


# ---------------------------------------------------------------------------------------------
# Local files


@dataclass(frozen=True)
class _Table:
    """The rows of one file or dataset split, with the columns its first record shows (None: no records)."""

    name: str  # the key in `PairReadStats.conventions`
    scope: str  # for whole-file errors
    columns: list[str] | None
    rows: Iterator[tuple[str, str, Row]]  # (locator, where, row)
    json_lists: bool = False  # CSV has no list type: a list column's cell is a JSON array


def _pair_files(source: PairFiles) -> tuple[list[Path], list[str]]:
    """(files to read, in sorted relative-path order; relative paths of ignored files)."""
    root = Path(source.path)
    supported = ", ".join(PAIR_FILE_EXTENSIONS)
    if not root.exists():
        raise SourceError(f"source {source.name!r}: path {root} does not exist")
    if root.is_file():
        if root.suffix.lower() not in PAIR_FILE_EXTENSIONS:
            raise SourceError(f"{root}: unsupported file type {root.suffix!r}; supported: {supported}")
        return [root], []
    entries = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix())
    files = [p for p in entries if p.suffix.lower() in PAIR_FILE_EXTENSIONS]
    ignored = [p.relative_to(root).as_posix() for p in entries if p.suffix.lower() not in PAIR_FILE_EXTENSIONS]
    if not files:
        raise SourceError(f"{root}: no {supported} files in this directory ({len(ignored)} other files)")
    return files, ignored


def _relative(source: PairFiles, file: Path) -> str:
    root = Path(source.path)
    return file.name if root.is_file() else file.relative_to(root).as_posix()


def _open_file(file: Path, relative: str) -> _Table:
    suffix = file.suffix.lower()
    if suffix == ".jsonl":
        rows = jsonl_rows(file, relative)
        first = next(rows, None)
        if first is None:
            return _Table(relative, str(file), None, iter(()))
        return _Table(relative, str(file), list(first[2]), chain([first], rows))
    if suffix == ".csv":
        header, rows = _csv_rows(file, relative)
        return _Table(relative, str(file), header, rows, json_lists=True)
    return _parquet_table(file, relative)


def _csv_rows(file: Path, relative: str) -> tuple[list[str] | None, Iterator[tuple[str, str, Row]]]:
    """(header, rows) of a CSV file; a row's line is the line its record starts on."""
    handle = file.open(encoding="utf-8-sig", newline="")  # -sig: a byte-order mark is not a column name
    reader = csv.reader(handle)
    try:
        header = next(reader, None)
    except (UnicodeDecodeError, csv.Error) as error:
        handle.close()
        raise _csv_error(file, reader.line_num or 1, error) from None
    if header is None:
        handle.close()
        return None, iter(())
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        handle.close()
        raise SourceError(f"{file} line 1: repeated column names {quoted_names(repeated)}")

    def rows() -> Iterator[tuple[str, str, Row]]:
        with handle:
            start = reader.line_num + 1
            while True:
                try:
                    cells = next(reader, None)
                except (UnicodeDecodeError, csv.Error) as error:
                    raise _csv_error(file, start, error) from None
                if cells is None:
                    return
                line, start = start, reader.line_num + 1
                if not cells:  # a blank line
                    continue
                if len(cells) != len(header):
                    raise SourceError(f"{file} line {line}: {len(cells)} cells, but the header has {len(header)}")
                yield f"{relative}:{line}", f"{file} line {line}", dict(zip(header, cells))

    return header, rows()


def _csv_error(file: Path, line: int, error: Exception) -> SourceError:
    if isinstance(error, UnicodeDecodeError):
        # The reader decodes in blocks, so its line count is not where the bad byte is: find it.
        with file.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as bad:
                    return SourceError(f"{file} line {number}: not UTF-8 (byte {raw[bad.start]:#04x} at column "
                                       f"{bad.start + 1}: {bad.reason}); save the file as UTF-8")
        return SourceError(f"{file}: not UTF-8 ({error.reason})")
    return SourceError(f"{file} line {line}: malformed CSV ({error})")


def _parquet_table(file: Path, relative: str) -> _Table:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file)
    except (pa.ArrowException, OSError) as error:
        raise SourceError(f"{file}: not a readable Parquet file ({error})") from None

    def rows() -> Iterator[tuple[str, str, Row]]:
        number = 0
        for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                yield f"{relative}:{number}", f"{file} row {number}", row
                number += 1

    return _Table(relative, str(file), parquet.schema_arrow.names, rows())


def _count_rows(file: Path) -> int:
    """Records in a file, as reading counts them (non-blank JSON lines, CSV records after the header)."""
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(file).metadata.num_rows
    if suffix == ".jsonl":
        with file.open("rb") as lines:
            return sum(1 for line in lines if line.strip())
    with file.open(encoding="utf-8-sig", newline="") as handle:
        return max(sum(1 for cells in csv.reader(handle) if cells) - 1, 0)


def _combined_revision(entries: Iterable[Mapping[str, Any]]) -> str:
    # Names as well as bytes: a renamed file changes pair ids.
    digest = hashlib.sha256("".join(f"{e['path']}\0{e['sha256']}\n" for e in entries).encode())
    return f"sha256:{digest.hexdigest()}"


def _files_provenance(source: PairFiles) -> dict[str, Any]:
    files, ignored = _pair_files(source)
    entries = []
    for file in files:
        relative = _relative(source, file)
        mapping = _resolve_mapping(source, _open_file(file, relative).columns, str(file))
        entries.append({**file_entry(file, relative), "rows": _count_rows(file),
                        "convention": mapping.convention if mapping else None})
    return {
        "name": source.name,
        "kind": "pair-files",
        "path": str(Path(source.path).resolve()),
        "revision": _combined_revision(entries),
        "files": entries,
        "ignored_files": ignored,
        "mapping": _mapping_dict(source),
    }


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets


def _hf_scope(source: HFPairs) -> str:
    config = f" config {source.config!r}" if source.config else ""
    return f"Hugging Face dataset {source.dataset!r} at revision {source.revision!r}{config}"


def _hf_error(source: HFPairs, error: Exception) -> SourceError:
    return SourceError(f"{_hf_scope(source)} split {source.split!r}: {type(error).__name__}: {error}")


def _is_local(source: HFPairs) -> bool:
    return Path(source.dataset).is_dir()  # datasets' own test: a directory is read before the hub is tried


def _load_hf(source: HFPairs) -> Any:
    # Imported here: `datasets` takes seconds to import and only this source needs it.
    import datasets

    local = _is_local(source)
    try:
        return datasets.load_dataset(
            source.dataset,
            name=source.config,
            split=source.split,
            revision=source.revision,
            # A local directory's cache is rebuilt on every read (see HFPairs). Its split-size checks are
            # off: datasets compares them with the sizes it recorded from the files as they were before.
            download_mode=datasets.DownloadMode.FORCE_REDOWNLOAD if local else None,
            verification_mode=datasets.VerificationMode.NO_CHECKS if local else None,
        )
    except Exception as error:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ValueError, ...)
        raise _hf_error(source, error) from error


def _hf_table(source: HFPairs, dataset: Any) -> _Table:
    scope = f"{_hf_scope(source)} split {source.split!r}"

    def rows() -> Iterator[tuple[str, str, Row]]:
        for number, row in enumerate(dataset):
            yield f"{source.split}:{number}", f"{_hf_scope(source)} row {source.split}:{number}", row

    columns = list(dataset.column_names) if len(dataset) else None
    return _Table(source.split, scope, columns, rows())


def _hf_provenance(source: HFPairs) -> dict[str, Any]:
    import datasets

    dataset = _load_hf(source)
    try:
        # The builder resolves the revision and lists the data files without reading them.
        builder = datasets.load_dataset_builder(source.dataset, name=source.config, revision=source.revision)
    except Exception as error:
        raise _hf_error(source, error) from error
    local = _is_local(source)
    data_files = []
    for split, paths in (builder.config.data_files or {}).items():
        for path in paths:
            file = Path(path)
            entry = file_entry(file, str(file)) if file.is_file() else {"path": str(path)}
            data_files.append({"split": str(split), **entry})
    # A local directory's content, by its files' names (relative, so the directory may move) and bytes.
    root = Path(source.dataset).resolve()
    content = [{**e, "path": Path(os.path.relpath(Path(e["path"]).resolve(), root)).as_posix()}
               for e in data_files if local and e["split"] == source.split and "sha256" in e]
    mapping = _resolve_mapping(source, _hf_table(source, dataset).columns, _hf_scope(source))
    return {
        "name": source.name,
        "kind": "hf-pairs",
        "dataset": source.dataset,
        "config": builder.config.name,
        "split": source.split,
        "revision": source.revision,
        # datasets ignores the revision of a local directory (see HFPairs): there, the data files'
        # sha256 pin the content, and builder.hash is a hash of its configuration, not of the files.
        "revision_applies": not local,
        "resolved_revision": None if local else builder.hash,  # the commit a hub revision resolved to
        "content_revision": _combined_revision(content) if local else None,  # the split's files
        "data_files": data_files,
        "rows": len(dataset),
        "convention": mapping.convention if mapping else None,
        "mapping": _mapping_dict(source),
        "datasets_version": datasets.__version__,
    }


# ---------------------------------------------------------------------------------------------
# BEIR folders


def _beir_paths(source: BEIRPairs) -> tuple[Path, Path, Path]:
    root = Path(source.path)
    return root / beir.CORPUS_FILE, root / beir.QUERIES_FILE, root / beir.QRELS_DIR / f"{source.split}.tsv"


def beir_doc_text(title: str, text: str) -> str:
    """A BEIR document as the BEIR evaluator embeds it (`beir.Task.doc_text`): "title. text", or the text."""
    return f"{title}. {text}" if title.strip() else text


def _beir_pairs(source: BEIRPairs, stats: PairReadStats, ids: _Ids) -> Iterator[UserPair]:
    corpus_path, queries_path, qrels_path = _beir_paths(source)
    if not Path(source.path).is_dir():
        raise SourceError(f"source {source.name!r}: BEIR folder {source.path} does not exist")
    try:
        # The evaluator's own readers and checks; `beir.load_task` is not used because it insists
        # on a test split, which a folder of training judgements need not have.
        corpus = beir.read_corpus(corpus_path)
        queries = beir.read_queries(queries_path)
        qrels = beir.read_qrels(qrels_path, queries, corpus)
    except beir.TaskFormatError as error:
        raise SourceError(f"source {source.name!r}: {error}") from None
    stats.conventions[source.split] = BEIR_CONVENTION
    for qid in sorted(qrels):
        stats.records += 1
        locator = f"{source.split}:{qid}"
        query = queries[qid].strip()
        if not query:
            raise SourceError(f"{queries_path}: query {quoted(qid)} (judged in {qrels_path}) has empty text")
        judged = sorted(qrels[qid].items(), key=lambda item: (-item[1], item[0]))  # best grade first
        positives = []
        for doc_id, grade in judged:
            if grade > 0:
                text = beir_doc_text(*corpus[doc_id]).strip()
                if not text:
                    raise SourceError(f"{corpus_path}: document {quoted(doc_id)} (relevant to query {quoted(qid)}) has empty text")
                positives.append((text, float(grade), doc_id))
        if not positives:
            stats.skip("no document graded > 0", locator)
            continue
        negatives = [beir_doc_text(*corpus[d]).strip() for d, g in sorted(qrels[qid].items()) if g <= 0] \
            if source.zero_grade_negatives else []
        pair = _assemble(ids, stats, locator, qid, query, positives, negatives)
        if pair is not None:
            yield pair


def _beir_provenance(source: BEIRPairs) -> dict[str, Any]:
    root = Path(source.path)
    entries = []
    for path in _beir_paths(source):
        if not path.is_file():
            raise SourceError(f"source {source.name!r}: {path}: file not found")
        with path.open("rb") as lines:
            rows = sum(1 for line in lines if line.strip())
        rows -= path.suffix == ".tsv"  # the qrels header
        entries.append({**file_entry(path, path.relative_to(root).as_posix()), "rows": rows})
    return {
        "name": source.name,
        "kind": "beir-pairs",
        "path": str(root.resolve()),
        "split": source.split,
        "revision": _combined_revision(entries),
        "files": entries,
        "convention": BEIR_CONVENTION,
        "zero_grade_negatives": source.zero_grade_negatives,
    }


# ---------------------------------------------------------------------------------------------
# Groups, splits and pair tables


@dataclass(frozen=True)
class GroupedPairs:
    """Pairs with their positive groups set, exact duplicates removed (`duplicates`: removed id -> kept id)."""

    pairs: tuple[UserPair, ...]
    duplicates: Mapping[str, str]
    threshold: float

    @property
    def groups(self) -> int:
        return len({pair.positive_group for pair in self.pairs})


def group_pairs(
    pairs: Sequence[UserPair], threshold: float = 0.8, *, num_perm: int = 128, seed: int = 1
) -> GroupedPairs:
    """Exact duplicates removed, then pairs joined into positive groups (union-find) wherever a
    text of one (its query or any positive) equals a text of another after `_fold`, or is its
    near duplicate (MinHash, `dedup.near_duplicate_clusters` at `threshold`).

    Query against positive counts too: a query that is another pair's positive would meet that
    positive as an in-batch negative, which is a false one. Negatives take no part: a negative
    is a text the user says does not answer. An exact duplicate is a pair whose folded query
    and set of folded positives equal an earlier one's in pair-id order; the smallest id is
    kept. A group is named by its smallest pair id, so the result does not depend on the
    pairs' order; the pairs keep their order.
    """
    ids = [pair.pair_id for pair in pairs]
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})[:MAX_SKIPPED_EXAMPLES]
        raise SourceError(f"pair ids repeat across sources (do two sources share a name?): {repeated}")
    kept: dict[tuple[str, tuple[str, ...]], str] = {}
    duplicates: dict[str, str] = {}
    for pair in sorted(pairs, key=lambda p: p.pair_id):
        key = (_fold(pair.query), tuple(sorted({_fold(p) for p in pair.positives})))
        if key in kept:
            duplicates[pair.pair_id] = kept[key]
        else:
            kept[key] = pair.pair_id
    survivors = [pair for pair in pairs if pair.pair_id not in duplicates]

    sets = SmallestRootSets()  # the root is always the smallest id
    find, union = sets.find, sets.union

    text_ids: list[tuple[str, int]] = []  # (pair id, 0 for the query or 1 + positive index)
    texts: list[str] = []
    first_with: dict[str, str] = {}
    for pair in survivors:
        for index, text in enumerate((pair.query, *pair.positives)):
            text_ids.append((pair.pair_id, index))
            texts.append(text)
            # Equal texts are linked here, not left to MinHash, which lower-cases rather than case-folds.
            union(pair.pair_id, first_with.setdefault(_fold(text), pair.pair_id))
    for (pair_id, _), (cluster_id, _) in near_duplicate_clusters(text_ids, texts, threshold, num_perm, seed).items():
        union(pair_id, cluster_id)
    grouped = tuple(dataclasses.replace(pair, positive_group=find(pair.pair_id)) for pair in survivors)
    return GroupedPairs(pairs=grouped, duplicates=duplicates, threshold=threshold)


def split_of_group(group: str, dev_fraction: float, test_fraction: float, seed: int) -> str:
    """train / dev / test from sha256(seed:group), the rule `corpus.split_of` applies to document groups."""
    digest = hashlib.sha256(f"{seed}:{group}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < dev_fraction:
        return "dev"
    if u < dev_fraction + test_fraction:
        return "test"
    return "train"


def split_pairs(grouped: GroupedPairs, dev_fraction: float, test_fraction: float, seed: int) -> tuple[UserPair, ...]:
    """The grouped pairs with `split` set by their group, so a group never straddles two splits."""
    if not (0.0 <= dev_fraction and 0.0 <= test_fraction and dev_fraction + test_fraction < 1.0):
        raise SourceError(
            f"dev_fraction {dev_fraction} and test_fraction {test_fraction} must be >= 0 and sum to less than 1"
        )
    return tuple(
        dataclasses.replace(pair, split=split_of_group(pair.positive_group, dev_fraction, test_fraction, seed))
        for pair in grouped.pairs
    )


USER_PAIR_SCHEMA = pa.schema([
    *PAIR_SCHEMA,
    ("positives", pa.list_(pa.string())),  # all the pair's positives; `positive` is this row's
    ("negatives", pa.list_(pa.string())),
    ("scores", pa.list_(pa.float64())),  # one per positive of `positives`, null without a score
])


def row_ids(pair: UserPair) -> list[str]:
    """The ids of a pair's training rows, one per positive: the pair id alone for one positive,
    else `<pair id>#<i>`."""
    if len(pair.positives) == 1:
        return [pair.pair_id]
    return [f"{pair.pair_id}#{i}" for i in range(len(pair.positives))]


def user_pair_rows(pairs: Iterable[UserPair], split: str = "train") -> list[dict[str, Any]]:
    """One split's pairs as rows of `USER_PAIR_SCHEMA`, one row per (query, positive) (`row_ids`):
    `pairs.PAIR_SCHEMA`'s fields (builder and source the source's name, confidence
    `USER_PAIR_CONFIDENCE`, the pair's positive group and documents) plus the pair's positives,
    negatives and scores. A row id that is another pair's id (a user id ending in "#<i>") raises."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    rows = []
    for pair in pairs:
        if pair.split is None or pair.positive_group is None:
            raise ValueError(f"pair {pair.pair_id!r} has no split or group: run group_pairs and split_pairs first")
        if pair.split != split:
            continue
        for row_id, positive in zip(row_ids(pair), pair.positives):
            rows.append({
                "pair_id": row_id,
                "builder": pair.source,
                "query": pair.query,
                "positive": positive,
                "source": pair.source,
                "doc_ids": list(pair.doc_ids),
                "split": pair.split,
                "confidence": USER_PAIR_CONFIDENCE,
                "positive_group": pair.positive_group,
                "positives": list(pair.positives),
                "negatives": list(pair.negatives),
                "scores": list(pair.scores),
            })
    repeated = sorted(i for i, n in Counter(row["pair_id"] for row in rows).items() if n > 1)
    if repeated:
        raise SourceError(f"row ids repeat: {repeated[:MAX_SKIPPED_EXAMPLES]}; a pair with several positives "
                          "gives rows '<pair id>#<i>', which another pair's id must not be")
    return rows


def user_pairs_to_table(pairs: Iterable[UserPair], split: str = "train") -> pa.Table:
    """`user_pair_rows` as a table; `.select(pairs.PAIR_SCHEMA.names)` is a table of `pairs.PAIR_SCHEMA`."""
    return pa.Table.from_pylist(user_pair_rows(pairs, split), schema=USER_PAIR_SCHEMA)
