"""The configs of document sources beyond the built-in corpus (`embedlab.data.external` reads them).

Kept apart from the readers so `embedlab.config` can hold them in `DataConfig` without
importing the readers, or anything but the standard library and `embedlab.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedlab.errors import UserError


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
        if not (self.revision or "").strip():  # None too: it is what an unset config value reads as
            raise SourceError(
                f"source {self.name!r}: HFDataset {self.dataset!r} needs a revision (a commit sha or tag): "
                "without one the hub serves whatever the default branch holds today, so the corpus "
                "could change between runs without anything saying so"
            )


ExternalSource = LocalFiles | HFDataset


def _check_fields(name: str, text_field: str) -> None:
    if not name:
        raise SourceError("an external source needs a non-empty name: it prefixes every document id")
    if not text_field:
        raise SourceError(f"source {name!r}: text_field must be non-empty")
