"""Pack tokenised documents into fixed-length rows that keep document boundaries.

Each document becomes its tokens followed by SEP (the boundary token). Rows of length
`sequence_length` are filled greedily in document order; a document that does not fit
the rest of a row continues in the next row as a new segment, unless fewer than
`min_fragment` positions are left, in which case the row is padded instead (a two-token
fragment teaches nothing). `segment_ids` number the pieces inside a row from 1 and
mark padding with 0; the encoder restricts attention and restarts RoPE positions per
segment, so no token ever sees another document.
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


def pack_documents(
    documents: Iterable[list[int]],
    *,
    sequence_length: int,
    sep_id: int,
    pad_id: int,
    min_fragment: int = 8,
) -> PackedRows:
    """Greedy boundary-preserving packing of token lists (without SEP) into (R, L) rows."""
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

    for index, tokens in enumerate(documents):
        remaining = list(tokens) + [sep_id]
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
