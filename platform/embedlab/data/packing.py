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
    pieces = [np.asarray(piece, dtype=np.int64) for piece in pieces]
    lengths = np.array([len(piece) for piece in pieces], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return pack_flat(values, offsets, sequence_length=sequence_length, pad_id=pad_id, min_fragment=min_fragment)


def pack_flat(
    values: np.ndarray,
    offsets: np.ndarray,
    *,
    sequence_length: int,
    pad_id: int,
    min_fragment: int = 8,
    pieces: np.ndarray | None = None,
) -> PackedRows:
    """`pack_pieces` over pieces given as one flat token array and offsets (piece k is
    `values[offsets[k]:offsets[k + 1]]`, or the `pieces`-selected ones, in that order), as
    Arrow list columns hold them.

    The layout (which fragment of which piece goes to which row, column and segment) depends
    on piece lengths only and is decided in a loop over pieces; the tokens are then moved in
    one vectorised gather, so the cost per token is numpy's, not Python's.
    """
    order = np.arange(len(offsets) - 1) if pieces is None else np.asarray(pieces, dtype=np.int64)
    starts, lengths = offsets[order], offsets[order + 1] - offsets[order]
    frag_src, frag_len, frag_dst, frag_seg, frag_piece = [], [], [], [], []
    row = fill = segment = 0
    for index, (source, remaining) in enumerate(zip(starts.tolist(), lengths.tolist())):
        while remaining:
            space = sequence_length - fill
            if space < min(min_fragment, remaining):
                row, fill, segment = row + 1, 0, 0  # pad the rest of the row
                continue
            take = min(space, remaining)
            segment += 1
            frag_src.append(source)
            frag_len.append(take)
            frag_dst.append(row * sequence_length + fill)
            frag_seg.append(segment)
            frag_piece.append(index)
            fill, source, remaining = fill + take, source + take, remaining - take
            if fill == sequence_length:
                row, fill, segment = row + 1, 0, 0
    rows = row + (fill > 0)
    shape = (rows, sequence_length)
    input_ids = np.full(shape, pad_id, dtype=np.int32)
    segment_ids = np.zeros(shape, dtype=np.int32)
    document_index = np.full(shape, -1, dtype=np.int32)
    if frag_len:
        frag_len_array = np.asarray(frag_len, dtype=np.int64)
        before = np.cumsum(frag_len_array) - frag_len_array  # tokens placed before each fragment
        within = np.arange(int(frag_len_array.sum())) - np.repeat(before, frag_len_array)
        source_index = np.repeat(np.asarray(frag_src, dtype=np.int64), frag_len_array) + within
        target_index = np.repeat(np.asarray(frag_dst, dtype=np.int64), frag_len_array) + within
        input_ids.reshape(-1)[target_index] = values[source_index]
        segment_ids.reshape(-1)[target_index] = np.repeat(np.asarray(frag_seg, dtype=np.int32), frag_len_array)
        document_index.reshape(-1)[target_index] = np.repeat(np.asarray(frag_piece, dtype=np.int32), frag_len_array)
    return PackedRows(input_ids=input_ids, segment_ids=segment_ids, document_index=document_index)
