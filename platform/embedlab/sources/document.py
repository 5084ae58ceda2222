"""The unit every source yields: one document with a stable id, its source and a content hash."""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass, field


def normalise_text(text: str) -> str:
    """NFKC, collapsed whitespace: the form content hashes and exact dedup are computed on."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def content_hash(text: str) -> str:
    """sha256 hex digest of the normalised text."""
    return hashlib.sha256(normalise_text(text).encode("utf-8")).hexdigest()


def document_text(title: str, text: str) -> str:
    """What a document is trained, tokenised, mined and audited as: "title\ntext", or the
    text alone when it has no title."""
    return f"{title}\n{text}" if title else text


def document_texts(table) -> list[str]:
    """`document_text` of every row of a table (pyarrow) with `title` and `text` columns."""
    return [document_text(t, x) for t, x in zip(table["title"].to_pylist(), table["text"].to_pylist())]


@dataclass(frozen=True, kw_only=True)
class Document:
    """One document.

    `doc_id` is stable across runs and machines: it is derived from the source name and a
    locator inside the source (a verse reference, a file path and section, an object's
    qualified name), never from iteration order. `title` may be empty; `text` is the body.
    `group` names what the document was cut from (a page, a module, a book) when a source
    cuts one into several documents; documents of one group always share a split.
    """

    doc_id: str
    source: str
    title: str
    text: str
    hash: str = field(default="")
    group: str = field(default="")

    def __post_init__(self) -> None:
        if not self.doc_id:
            raise ValueError("Document.doc_id must be non-empty")
        if not self.text.strip():
            raise ValueError(f"Document {self.doc_id!r}: text is empty")
        if not self.hash:
            object.__setattr__(self, "hash", content_hash(self.text))
