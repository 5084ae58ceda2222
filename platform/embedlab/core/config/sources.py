"""The configs of sources: documents beyond the built-in corpus (`embedlab.sources.external`
reads them), a user's own pair sources (`embedlab.pairs.readers` reads them), and the names of
the built-in pair builders (`embedlab.pairs.builders.PAIR_BUILDERS` maps exactly these names to
their functions), so that a data config can refuse a pair source named like a builder.

A source is read from this machine: a path that is a URI (`s3://...`) is refused at
construction, in a line that names its scheme and never the URI itself (it may carry a
credential); copy the files to a local or shared disk, or publish them as a Hub dataset.

Configs only: the standard library and `embedlab.core.errors`, no reader.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedlab.core.errors import UserError


class SourceError(UserError):
    """An external source cannot be read; the message names the file or dataset and what is wrong."""


@dataclass(frozen=True, kw_only=True)
class LocalFiles:
    """A .jsonl, .parquet or .txt file, or a directory of them (other files are listed, not read).

    The field names apply to JSON lines and Parquet rows; a missing title or id field is fine.
    """

    name: str
    path: str
    text_field: str = "text"
    title_field: str | None = "title"
    id_field: str | None = "id"

    def __post_init__(self) -> None:
        _check_fields(self.name, self.text_field)
        _check_local(self.name, "path", self.path)


@dataclass(frozen=True, kw_only=True)
class HFDataset:
    """A dataset as `datasets.load_dataset(dataset, name=config, split=split, revision=revision)` loads it.

    `dataset` is a hub repository id or a local directory of data files. `revision` is
    required: a commit sha (or a tag) is what makes the documents the same on every run.
    Offline, datasets may fall back to a cached copy of a hub dataset whatever its revision;
    `external_provenance`'s `resolved_revision` says which commit was used.
    """

    name: str
    dataset: str
    revision: str
    config: str | None = None
    split: str = "train"
    text_field: str = "text"
    title_field: str | None = None
    id_field: str | None = None
    streaming: bool = False

    def __post_init__(self) -> None:
        _check_fields(self.name, self.text_field)
        _check_local(self.name, "dataset", self.dataset)
        if not (self.revision or "").strip():  # None too: it is what an unset config value reads as
            raise SourceError(
                f"source {self.name!r}: HFDataset {self.dataset!r} needs a revision (a commit sha or tag): "
                "without one the hub serves whatever the default branch holds today, so the corpus "
                "could change between runs without anything saying so"
            )


ExternalSource = LocalFiles | HFDataset


def _check_local(name: str, field: str, value: str) -> None:
    """A source's path (or dataset) is local or a Hub id, never a URI, which is refused without
    being echoed: only its scheme is named."""
    if not isinstance(value, str) or not value.strip():
        raise SourceError(f"source {name!r}: {field} must be a non-empty string")
    scheme, separator, _ = value.partition("://")
    if separator:
        raise SourceError(
            f"source {name!r}: {field} is a {scheme.lower()[:16]}:// URI; sources are read from this machine, so "
            "copy the files to a local (or shared) disk and name that path (the URI is not shown: it may carry a "
            "credential)")


def _check_fields(name: str, text_field: str) -> None:
    if not name:
        raise SourceError("an external source needs a non-empty name: it prefixes every document id")
    if not text_field:
        raise SourceError(f"source {name!r}: text_field must be non-empty")

BUILDER_NAMES: tuple[str, ...] = (
    "same-source-spans", "title-body", "term-definition", "synonyms", "lead-rest", "keyword",
)


@dataclass(frozen=True, kw_only=True)
class ColumnMapping:
    """Which columns hold the query, positive, negatives, score and id; unset: recognised.

    Set `query_field` and `positive_field` together to map columns yourself; the negative
    and score fields only take effect with them (a recognised convention finds its own).
    """

    query_field: str | None = None
    positive_field: str | None = None
    negative_fields: tuple[str, ...] = ()  # one negative text per column
    negatives_field: str | None = None  # a column holding a list of negative texts
    score_field: str | None = None  # score <= 0: not a positive pair, skipped
    id_field: str | None = "id"  # optional per record: without a value the locator is the id

    def _check_mapping(self, name: str) -> None:
        if (self.query_field is None) != (self.positive_field is None):
            raise SourceError(f"source {name!r}: set query_field and positive_field together, or neither")
        explicit = (self.negative_fields, self.negatives_field, self.score_field)
        if self.query_field is None and any(explicit):
            raise SourceError(
                f"source {name!r}: negative_fields, negatives_field and score_field need query_field and "
                "positive_field: without them the columns are recognised by convention, negatives and score included"
            )
        if not isinstance(self.negative_fields, tuple):
            raise SourceError(f"source {name!r}: negative_fields must be a tuple of column names")
        named = [c for c in (self.query_field, self.positive_field, *self.negative_fields,
                             self.negatives_field, self.score_field) if c is not None]
        if any(not c for c in named) or len(set(named)) != len(named):
            raise SourceError(f"source {name!r}: mapped columns must be distinct non-empty names, got {named}")


def _check_source(name: str, rights: str) -> None:
    if not name:
        raise SourceError("a pair source needs a non-empty name: it prefixes every pair id")
    if not (rights or "").strip():
        raise SourceError(
            f"source {name!r}: rights must state the licence or permission these pairs are used under; "
            "it is recorded in the provenance so whoever ships the model can check the terms"
        )


@dataclass(frozen=True, kw_only=True)
class PairFiles(ColumnMapping):
    """A .jsonl, .parquet or .csv file of pairs, or a directory of them."""

    name: str
    path: str
    rights: str

    def __post_init__(self) -> None:
        _check_source(self.name, self.rights)
        _check_local(self.name, "path", self.path)
        self._check_mapping(self.name)


@dataclass(frozen=True, kw_only=True)
class HFPairs(ColumnMapping):
    """Pairs as `datasets.load_dataset(dataset, name=config, split=split, revision=revision)` loads them.

    `dataset` is a hub repository id or a local directory in the hub's layout (data files
    named by split, or a README.md whose `configs` name them). `revision` is required: a
    commit sha (or tag) is what makes a hub dataset the same on every run. For a local
    directory datasets ignores the revision (datasets 5.2: any string loads the same files),
    so the files' sha256 in the provenance are what pin it, and each read rebuilds datasets'
    cache of it, without datasets' split-size checks: datasets keys that cache of a
    README-declared config by the files' paths, not their contents, and would keep serving
    the old rows of an edited file (and then check new rows against the old sizes).
    """

    name: str
    dataset: str
    revision: str
    rights: str
    config: str | None = None
    split: str = "train"

    def __post_init__(self) -> None:
        _check_source(self.name, self.rights)
        _check_local(self.name, "dataset", self.dataset)
        self._check_mapping(self.name)
        if not (self.revision or "").strip():  # None too: it is what an unset config value reads as
            raise SourceError(
                f"source {self.name!r}: HFPairs {self.dataset!r} needs a revision (a commit sha or tag): "
                "without one the hub serves whatever the default branch holds today, so the pairs "
                "could change between runs without anything saying so"
            )


@dataclass(frozen=True, kw_only=True)
class BEIRPairs:
    """The judgements of one split of a BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv).

    Each judged query becomes one pair with all its documents graded > 0 as positives. With
    `zero_grade_negatives` the documents judged <= 0 for it become its negatives: a judge
    read them and said not relevant, which makes them hard negatives, but some sets grade 0
    for "related, not the answer", so it is off unless asked for.
    """

    name: str
    path: str
    rights: str
    split: str = "train"
    zero_grade_negatives: bool = False

    def __post_init__(self) -> None:
        _check_source(self.name, self.rights)
        _check_local(self.name, "path", self.path)
        if not self.split or any(c in self.split for c in "/\\") or self.split.startswith("."):
            raise SourceError(f"source {self.name!r}: split {self.split!r} is not a qrels file name")


PairSource = PairFiles | HFPairs | BEIRPairs
