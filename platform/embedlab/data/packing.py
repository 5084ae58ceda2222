"""Cut tokenised documents into pieces and pack pieces into rows that keep boundaries.

Each document becomes its tokens followed by SEP (the boundary token), cut into pieces
of at most `sequence_length` tokens (`chunk_document`); a document longer than that is
never truncated, it continues in further pieces (each its own attention segment), and
the share of such documents is recorded as the truncation frequency. Rows of length
`sequence_length` are filled greedily in order; a piece that does not fit the rest of a
row continues in the next row as a new segment, unless fewer than `min_fragment`
positions are left, in which case the row is padded instead (a two-token fragment
teaches nothing). `segment_ids` number the segments inside a row from 1 and mark padding
with 0; the encoder restricts attention and restarts RoPE positions per segment, so no
token ever sees another document.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PackedRows:
    """`input_ids` and `segment_ids`, both (R, L) int32; `document_index` (R, L) int32, -1 on PAD."""

    input_ids: np.ndarray
    segment_ids: np.ndarray
    document_index: np.ndarray

    @property
    def non_padding_tokens(self) -> int:
        return int((self.segment_ids > 0).sum())

    @property
    def efficiency(self) -> float:
        """Non-padding share of all positions."""
        return self.non_padding_tokens / max(self.segment_ids.size, 1)


def chunk_document(tokens: list[int], *, sequence_length: int, sep_id: int) -> list[list[int]]:
    """A document's tokens + SEP cut into consecutive pieces of at most `sequence_length`."""
    stream = list(tokens) + [sep_id]
    return [stream[i : i + sequence_length] for i in range(0, len(stream), sequence_length)]


def pack_documents(
    documents: Iterable[list[int]],
    *,
    sequence_length: int,
    sep_id: int,
    pad_id: int,
    min_fragment: int = 8,
) -> PackedRows:
    """Greedy boundary-preserving packing of token lists (without SEP) into (R, L) rows."""
    return pack_pieces(
        (list(tokens) + [sep_id] for tokens in documents),
        sequence_length=sequence_length, pad_id=pad_id, min_fragment=min_fragment,
    )


def pack_pieces(
    pieces: Iterable[list[int]],
    *,
    sequence_length: int,
    pad_id: int,
    min_fragment: int = 8,
) -> PackedRows:
    """Greedy packing of token pieces (boundary tokens already in place) into (R, L) rows;
    `document_index` holds each position's piece index in `pieces`."""
    rows_ids: list[list[int]] = []
    rows_seg: list[list[int]] = []
    rows_doc: list[list[int]] = []
    ids: list[int] = []
    seg: list[int] = []
    doc: list[int] = []

    def close_row() -> None:
        nonlocal ids, seg, doc
        pad = sequence_length - len(ids)
        rows_ids.append(ids + [pad_id] * pad)
        rows_seg.append(seg + [0] * pad)
        rows_doc.append(doc + [-1] * pad)
        ids, seg, doc = [], [], []

    for index, piece in enumerate(pieces):
        remaining = list(piece)
        while remaining:
            space = sequence_length - len(ids)
            if space < min(min_fragment, len(remaining)):
                close_row()
                continue
            piece, remaining = remaining[:space], remaining[space:]
            segment = (seg[-1] if seg else 0) + 1
            ids += piece
            seg += [segment] * len(piece)
            doc += [index] * len(piece)
            if len(ids) == sequence_length:
                close_row()
    if ids:
        close_row()
    shape = (len(rows_ids), sequence_length)
    return PackedRows(
        input_ids=np.asarray(rows_ids, dtype=np.int32).reshape(shape),
        segment_ids=np.asarray(rows_seg, dtype=np.int32).reshape(shape),
        document_index=np.asarray(rows_doc, dtype=np.int32).reshape(shape),
    )
